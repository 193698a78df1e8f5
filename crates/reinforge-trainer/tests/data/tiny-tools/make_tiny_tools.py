"""Writes a tiny model *shape* that can call verl's GSM8K tool, and its data, for the tool-agent
tests (a random-init 2-layer Llama; `init = "random"` in the config):

- tokenizer.json: a word-level vocabulary with ONE token per whole call,
  `<tool_call>{"name": "calc_gsm8k_reward", "arguments": {"answer": "N"}}</tool_call>` for N in
  0..8, so a random policy makes calls from its first step (a call written token by token would
  almost never parse); `<tool_response>` tags as tokens; the words of the tool's answers.
- tokenizer_config.json: a chat template that shows the tools' names and renders `tool`
  messages inside `<tool_response>` tags.
- config.json: examples/tiny-arith's shape with this vocabulary.
- train.jsonl: 16 rows in the schema of verl's gsm8k_multiturn_w_tool.py ("what is a + b ?",
  the sum as reward_model.ground_truth and as the tool's create_kwargs.ground_truth).
Run from this directory: python3 make_tiny_tools.py
"""
import json

SPECIAL = ["<pad>", "<eos>", "<unk>"]
CALLS = [f'<tool_call>{{"name": "calc_gsm8k_reward", "arguments": {{"answer": "{n}"}}}}</tool_call>' for n in range(9)]
TAGS = ["<tool_response>", "</tool_response>"]
WORDS = [str(d) for d in range(10)] + ["what", "is", "+", "-", "?", "####", "current", "parsed", "answer", "reward", "=", "='", "'",
                                        ".", "tools", ":", "assistant", "calc_gsm8k_reward"]

vocab = {}
for t in SPECIAL + CALLS + TAGS + WORDS:
    vocab.setdefault(t, len(vocab))
added = [{"id": vocab[t], "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": t in SPECIAL}
         for t in SPECIAL + CALLS + TAGS]
tokenizer = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": {"type": "Lowercase"},
             "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None, "decoder": None,
             "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}}
with open("tokenizer.json", "w") as f:
    json.dump(tokenizer, f, indent=1, ensure_ascii=False)
    f.write("\n")

template = ("{% if tools %}tools :{% for t in tools %} {{ t.function.name }}{% endfor %} {% endif %}"
            "{% for m in messages %}{% if m.role == 'tool' %} <tool_response> {{ m.content }} </tool_response>"
            "{% else %}{{ m.content }}{% endif %}{% endfor %}{% if add_generation_prompt %} assistant :{% endif %}")
with open("tokenizer_config.json", "w") as f:
    json.dump({"bos_token": None, "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>", "chat_template": template,
               "tokenizer_class": "PreTrainedTokenizerFast"}, f, indent=1)
    f.write("\n")

with open("../../../../../examples/tiny-arith/config.json") as f:
    config = json.load(f)
config["vocab_size"] = len(vocab)
config["max_position_embeddings"] = 256
with open("config.json", "w") as f:
    json.dump(config, f, indent=1)
    f.write("\n")

with open("train.jsonl", "w") as f:
    for i in range(16):
        a, b = i % 5, i % 4
        gt = str(a + b)
        f.write(json.dumps({"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": f"what is {a} + {b} ?"}],
                            "reward_model": {"style": "rule", "ground_truth": gt},
                            "extra_info": {"index": i, "tools_kwargs": {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": gt}}}}}) + "\n")
print(len(vocab), "tokens")
