"""Goldens for Search-R1's format reward, from Search-R1's own scoring code.

    git -C Search-R1 show HEAD:verl/utils/reward_score/qa_em_format.py > /tmp/qa_em_format.py
    python3 make_search_r1_format_golden.py /tmp/qa_em_format.py "$(git -C Search-R1 rev-parse HEAD)" > search_r1_format.json

Search-R1 scores the decoded prompt + response; each case's `response` is what follows
the assistant marker of a prompt made the way Search-R1's `nq_search.py` makes it (Qwen's
chat template around its `make_prefix`), so the prompt's own `<answer>` examples are in the
text Search-R1 reads, as in training. Reinforge scores the response alone and must agree.
No gold answer is "Beijing" (the prompt's example answer, which Search-R1 would match),
and none normalises to "", "and", "a", "d" or "n": Search-R1's retrieval check also reads the
prompt's "<information> and </information>", which holds those; and every target is a list
(a plain string target is read character by character there).
"""
import contextlib, importlib.util, io, itertools, json, sys

spec = importlib.util.spec_from_file_location("qa_em_format", sys.argv[1])
qa = importlib.util.module_from_spec(spec)
spec.loader.exec_module(qa)

QUESTION = "what colour is the quenul?"
PREFIX = f"""Answer the given question. \
You must conduct reasoning inside <think> and </think> first every time you get new information. \
After reasoning, if you find you lack some knowledge, you can call a search engine by <search> query </search> and it will return the top searched results between <information> and </information>. \
You can search as many times as your want. \
If you find no further external knowledge needed, you can directly provide the answer inside <answer> and </answer>, without detailed illustrations. For example, <answer> Beijing </answer>. Question: {QUESTION}\n"""
PROMPT = f"<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n{PREFIX}<|im_end|>\n<|im_start|>assistant\n"

FOUND = '<information>Doc 1(Title: "Quenul") The quenul is Sky-blue, like the sea.</information>'
MISSED = '<information>Doc 1(Title: "Velkov") The velkov is green.</information>'
RESPONSES = [
    # valid structures
    "<think> I know this. </think>\n<answer> sky blue </answer>",
    "<think> I know this. </think>\n<answer> red </answer>",
    f"<think> look it up </think>\n<search> quenul </search>\n\n{FOUND}\n\n<think> found </think>\n<answer> Sky Blue </answer>",
    f"<think> look it up </think>\n<search> quenul </search>\n\n{FOUND}\n\n<think> hmm </think>\n<answer> navy </answer>",
    f"<think> look </think>\n<search> velkov </search>\n\n{MISSED}\n\n<think> hmm </think>\n<answer> navy </answer>",
    f"<think>a</think><search>x</search>{MISSED}<think>b</think><search>y</search>{FOUND}<think>c</think><answer>the sky blue.</answer>",
    f"<think>a</think><search>x</search>{MISSED}<think>b</think><search>y</search>{FOUND}<think>c</think><answer>teal</answer>\n",
    # broken structures
    "<answer> sky blue </answer>",
    "<answer> red </answer>",
    "The answer is <answer> sky blue </answer>",
    "<think> a </think> so <answer> red </answer>",
    f"<search> quenul </search>{FOUND}<think> ok </think><answer> navy </answer>",
    f"<think> a </think><search> quenul </search>{FOUND}<answer> sky blue </answer>",
    "<think> a </think><answer> red </answer><answer> sky blue </answer>",
    "<think> a </think><answer> sky blue </answer><answer> red </answer>",
    "<think> a <think> b </think> </think><answer> sky blue </answer>",
    "<think> a </think><answer> sky blue </answer> trailing words",
    "<think> a </think><answer> sky blue",
    # no answer at all
    "<think> I do not know </think>",
    f"<think> look it up </think>\n<search> quenul </search>\n\n{FOUND}\n\n",
    "",
    "sky blue",
]
GOLDS = [{"target": ["Sky Blue", "sky-blue"]}, {"target": ["azure"]}]
PARAMS = [(0.2, 0.1, 0.0), (0.2, 0.1, 0.1), (0.0, 0.0, 0.3), (0.3, 0.0, 0.0), (0.0, 0.15, 0.0)]

cases = []
for resp, gt, (s, f, r) in itertools.product(RESPONSES, GOLDS, PARAMS):
    with contextlib.redirect_stdout(io.StringIO()):  # it prints one case in 64 at random
        score = qa.compute_score_em(PROMPT + resp, gt, structure_format_score=s, final_format_score=f, retrieval_score=r)
    valid, _ = qa.is_valid_sequence(PROMPT + resp)
    cases.append({"response": resp, "ground_truth": gt, "structure_format_score": s, "final_format_score": f,
                  "retrieval_score": r, "valid_structure": valid, "score": score})
json.dump({"source": f"Search-R1 {sys.argv[2] if len(sys.argv) > 2 else '?'} verl/utils/reward_score/qa_em_format.py", "cases": cases}, sys.stdout, indent=1)
print()
