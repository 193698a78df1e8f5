"""Writes nq_search_sample.parquet: three rows exactly as Search-R1's
scripts/data_process/nq_search.py writes them (pandas + pyarrow, via HF datasets' to_parquet,
which keeps FlashRAG's own columns `id`, `question`, `golden_answers` beside verl's), for the
loader test (tests/all/formats.rs). Run once with pandas and pyarrow installed:
    python make_nq_search.py
"""
import pandas as pd

TEMPLATE = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you get new "
    "information. After reasoning, if you find you lack some knowledge, you can call a search engine by <search> query "
    "</search> and it will return the top searched results between <information> and </information>. You can search as "
    "many times as your want. If you find no further external knowledge needed, you can directly provide the answer "
    "inside <answer> and </answer>, without detailed illustrations. For example, <answer> Beijing </answer>. "
    "Question: {question}\n"
)

rows = []
for idx, (qid, question, answers) in enumerate([
    ("test_0", "who got the first nobel prize in physics", ["Wilhelm Conrad Röntgen"]),
    ("test_1", "when is the next deadpool movie being released", ["May 18, 2018"]),
    ("test_2", "which mode is used for short wave broadcast service?", ["Olivia", "MFSK"]),
]):
    q = question.strip()
    if q[-1] != "?":
        q += "?"
    rows.append({
        "id": qid,
        "question": question,
        "golden_answers": answers,
        "data_source": "nq",
        "prompt": [{"role": "user", "content": TEMPLATE.format(question=q)}],
        "ability": "fact-reasoning",
        "reward_model": {"style": "rule", "ground_truth": {"target": answers}},
        "extra_info": {"split": "test", "index": idx},
    })
pd.DataFrame(rows).to_parquet("nq_search_sample.parquet")
