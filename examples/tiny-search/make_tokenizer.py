"""Writes tokenizer.json and tokenizer_config.json of examples/tiny-search: a word-level
vocabulary with the words of `reinforge data gen search --seed 1 --entities 16` (its invented
names and colours, the passages' and questions' words), Search-R1's tags as single tokens, and
one token per whole action: `<search> NAME </search>` for each name, `<answer> COLOUR
</answer>` for each colour. A randomly initialised 2-layer model could not find a
three-token action by chance (about 1 in 50^3 per turn); with one token per action, GRPO
explores them at once and learns which to take. Every other word (most of Search-R1's
instructions) reads as <unk>. Run from this directory:
    python3 make_tokenizer.py
"""
import json

NAMES = ["quenul", "tarokov", "thotaro", "ixdrak", "phagar", "velsel", "yunquen", "selbrem",
         "garquen", "thoyun", "ixpha", "ulquen", "mirataro", "blaxbrem", "velkov", "drakdrak"]
COLORS = ["red", "blue", "green", "yellow", "purple", "orange", "white", "black", "pink", "brown", "grey", "gold", "silver",
          "violet", "cyan", "teal"]
WORDS = ["the", "is", "what", "color", "question", "doc", "title", "1", "2", "3", ".", "?", ":", "(", ")", "\"", "\")", "search", "answer"]
TAGS = ["<think>", "</think>", "<search>", "</search>", "<answer>", "</answer>", "<information>", "</information>"]
SPECIAL = ["<pad>", "<eos>", "<unk>"]
ACTIONS = [f"<search> {n} </search>" for n in NAMES] + [f"<answer> {c} </answer>" for c in COLORS]

vocab = {}
for t in SPECIAL + TAGS + ACTIONS + NAMES + COLORS + WORDS:
    vocab.setdefault(t, len(vocab))

added = [
    {"id": vocab[t], "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": t in SPECIAL}
    for t in SPECIAL + TAGS + ACTIONS
]
tokenizer = {
    "version": "1.0",
    "truncation": None,
    "padding": None,
    "added_tokens": added,
    "normalizer": {"type": "Lowercase"},
    "pre_tokenizer": {"type": "Whitespace"},
    "post_processor": None,
    "decoder": None,
    "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
}
with open("tokenizer.json", "w") as f:
    json.dump(tokenizer, f, indent=1, ensure_ascii=False)
    f.write("\n")
with open("tokenizer_config.json", "w") as f:
    json.dump({
        "bos_token": None, "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>", "model_max_length": 256,
        # The prompt as written (Search-R1's data carries its whole instruction in one user turn).
        "chat_template": "{% for message in messages %}{{ message['content'] }}{% endfor %}",
        "tokenizer_class": "PreTrainedTokenizerFast",
    }, f, indent=1)
    f.write("\n")
print(len(vocab), "tokens")
