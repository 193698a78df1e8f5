"""Golden data for the Rust port of verl's ToolAgentLoop ("tool_agent") and search-result formatting.

Drives verl b178a3cd's REAL ToolAgentLoop.run (real __init__, AgentLoopBase.apply_chat_template with
processor=None, initialize_system_prompt, HermesToolParser, Gsm8kTool via initialize_tools_from_config)
against a scripted fake server_manager. Provenance / how to rerun:

Interaction cases (INTERACTION_CASES, "interaction": true) additionally set multi_turn.interaction_config_path to
examples/sglang_multiturn/config/interaction_config/gsm8k_interaction_config.yaml, so the real __init__ calls
initialize_interactions_from_config (real Gsm8kInteraction, gsm8k strict scoring), and run() gets
extra_info={"interaction_kwargs": {...}}. They record "interaction_kwargs", "turn_scores" (extra_fields) and
"interaction_inputs" (the last assistant content each generate_response call scored, observed by a spy that
calls through). A case whose run() raises is recorded with "error" (str of the exception) instead of outputs.
Every case has "interaction" (bool); the tool-only cases carry no other new field.

  git -C /work/.mirror/volcengine+verl/repo archive b178a3cd verl examples | tar -x -C /tmp/verl_b178
  pip install --target /tmp/pydeps hydra-core antlr4-python3-runtime==4.9.3 cachetools pillow aiohttp datasets
  /tmp/tv/bin/python make_tool_agent_golden.py      # torch, transformers 5.x, ray, pydantic, omegaconf

Two compatibility shims (nothing in verl is stubbed or re-implemented):
  * transformers 5 dropped AutoModelForVision2Seq, which verl/utils/model.py imports at module load
    (never used by the loop): it is aliased to AutoModelForImageTextToText.
  * transformers 5 made apply_chat_template(tokenize=True) return a BatchEncoding; verl b178a3cd was
    written against transformers 4 (a plain list of ids). The tokenizer defaults return_dict=False.
"""
import asyncio, json, os, sys

VERL_SRC = os.environ.get("VERL_SRC", "/tmp/verl_b178")
sys.path[:0] = [VERL_SRC, os.environ.get("EXTRA_SITE", "/tmp/pydeps")]

import transformers  # noqa: E402
import transformers.image_processing_utils, transformers.models, transformers.processing_utils  # noqa: E401,E402

transformers.AutoModelForVision2Seq = transformers.AutoModelForImageTextToText  # shim 1 (import only)

from omegaconf import OmegaConf  # noqa: E402
import verl  # noqa: E402
from verl.experimental.agent_loop.agent_loop import DictConfigWrap  # noqa: E402
from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop  # noqa: E402
from verl.tools.utils import search_r1_like_utils as sr  # noqa: E402
from verl.utils.dataset.rl_dataset import RLHFDataset  # noqa: E402
from verl.workers.rollout.replica import TokenOutput  # noqa: E402

assert verl.__file__.startswith(VERL_SRC), verl.__file__
HERE = os.path.dirname(os.path.abspath(__file__))
FIX = "/work/shared/fixtures/chat_templates"
TOOL_YAML = f"{VERL_SRC}/examples/sglang_multiturn/config/tool_config/gsm8k_tool_config.yaml"
INTERACTION_YAML = f"{VERL_SRC}/examples/sglang_multiturn/config/interaction_config/gsm8k_interaction_config.yaml"


class Tokenizer(transformers.PreTrainedTokenizerFast):
    def apply_chat_template(self, *args, **kwargs):  # shim 2: transformers-4 return type (list of ids)
        kwargs.setdefault("return_dict", False)
        return super().apply_chat_template(*args, **kwargs)


tok = Tokenizer(tokenizer_file=f"{FIX}/qwen2_5_tokenizer.json", eos_token="<|im_end|>", pad_token="<|endoftext|>")
tok.chat_template = open(f"{FIX}/qwen2_5.jinja").read()
EOS = tok.convert_tokens_to_ids("<|im_end|>")

# Messages exactly as examples/data_preprocess/gsm8k_multiturn_w_tool.py builds them (GSM8K train[0]).
SYSTEM = (
    "You are a math expert. You are given a question and you need to solve it step by step. "
    "Reasoning step by step before any tool call. "
    "You should use the `calc_gsm8k_reward` tool after step by step solving the question, "
    "before generate final answer at least once and refine your answer if necessary. "
    "Put your final answer in the format of `#### <answer>`."
)
QUESTION = (
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May? "
    "Let's think step by step and output the final answer after `####`."
)
MESSAGES = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
TOOLS_KWARGS = {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "72"}}}
MT_DEFAULTS = dict(max_assistant_turns=5, max_user_turns=None, max_parallel_calls=1,
                   max_tool_response_length=256, tool_response_truncate_side="middle")


def call(args_json, name="calc_gsm8k_reward"):  # a hermes tool call with raw JSON text for "arguments"
    return f'<tool_call>\n{{"name": "{name}", "arguments": {args_json}}}\n</tool_call>'


def ans(a):
    return call(json.dumps({"answer": a}, ensure_ascii=False))


CUT = object()  # marker: a turn given as (text, CUT) gets no <|im_end|> appended
THINK = "April: 48 clips. May: 48 / 2 = 24 clips. Total: 48 + 24 = 72.\n"
FINAL = "The tool confirms it.\n#### 72"
LONG = "In April she sold 48 clips and in May half as many, 24, so altogether 48 + 24 = 72"

# (name, turn texts, overrides of MT_DEFAULTS / response_length)
CASES = [
    ("right_answer", [THINK + ans("72"), FINAL], {}),
    ("wrong_answer", [ans("70"), "#### 70"], {}),
    ("no_tool_call", [THINK + "#### 72"], {}),
    ("two_rounds_rewards", [ans("70"), ans("72"), FINAL], {}),
    ("two_calls_parallel1", [ans("70") + "\n" + ans("72"), FINAL], {}),
    ("two_calls_parallel2", [ans("70") + "\n" + ans("72"), FINAL], {"max_parallel_calls": 2}),
    ("three_calls_parallel2", [ans("70") + "\n" + ans("71") + "\n" + ans("72"), FINAL], {"max_parallel_calls": 2}),
    ("malformed_json_only", ['<tool_call>\n{"name": "calc_gsm8k_reward", "arguments": {"answer": "72"}\n</tool_call>'], {}),
    ("malformed_then_valid", ['<tool_call>\n{"name": calc_gsm8k_reward}\n</tool_call>\n' + ans("72"), FINAL], {}),
    ("unknown_tool", [call('{"answer": "72"}', name="calculator"), FINAL], {}),
    ("arguments_string", [call('"72"'), FINAL], {}),
    ("arguments_null", [call("null"), FINAL], {}),
    ("arguments_missing_answer", [call('{"value": "72"}'), FINAL], {}),
    ("arguments_key_missing", ['<tool_call>\n{"name": "calc_gsm8k_reward"}\n</tool_call>'], {}),
    ("answer_number_72", [call('{"answer": 72}'), FINAL], {}),
    ("answer_number_72_0", [call('{"answer": 72.0}'), FINAL], {}),
    ("answer_bool_true", [call('{"answer": true}'), FINAL], {}),
    ("answer_json_null", [call('{"answer": null}'), FINAL], {}),
    ("answer_hashes", [ans("#### 72"), FINAL], {}),
    ("answer_quote_newline", [ans("it's\n72"), FINAL], {}),
    ("answer_both_quotes_tab_backslash", [ans("it's \"72\"\t\\"), FINAL], {}),
    ("answer_non_ascii", [ans("答案是 72 ✓"), FINAL], {}),
    ("answer_unicode_escape_in_json", [call('{"answer": "\\u00e9t\\u00e9 72"}'), FINAL], {}),
    ("answer_trailing_dot", [ans("72."), FINAL], {}),
    ("answer_negative", [ans("-72"), FINAL], {}),
    ("answer_sentence", [ans("48 + 24 = 72"), FINAL], {}),
    ("cut_first_turn_over_budget", [(THINK * 4, CUT)], {"response_length": 32}),
    ("cut_after_tool", [ans("72"), (THINK * 3, CUT)], {"response_length": 96}),
    ("tool_call_without_eos", [(ans("72"), CUT), FINAL], {}),
    ("gen_exactly_fills_budget", [ans("72"), FINAL], {"response_length": "len_turn0"}),
    ("tool_overflows_budget", [ans("72"), FINAL], {"response_length": "len_turn0+tool-1"}),
    ("tool_exactly_fills_budget", [ans("72"), FINAL], {"response_length": "len_turn0+tool"}),
    ("tool_fits_with_one_spare", [ans("72"), FINAL], {"response_length": "len_turn0+tool+1"}),
    ("max_assistant_turns_2", [ans("70"), ans("71"), ans("72")], {"max_assistant_turns": 2}),
    ("max_assistant_turns_1", [ans("72"), FINAL], {"max_assistant_turns": 1}),
    ("max_user_turns_1", [ans("70"), ans("72"), FINAL], {"max_user_turns": 1}),
    ("truncate_left_20", [ans(LONG), FINAL], {"max_tool_response_length": 20, "tool_response_truncate_side": "left"}),
    ("truncate_right_20", [ans(LONG), FINAL], {"max_tool_response_length": 20, "tool_response_truncate_side": "right"}),
    ("truncate_middle_20", [ans(LONG), FINAL], {"max_tool_response_length": 20}),
    ("truncate_middle_21", [ans(LONG), FINAL], {"max_tool_response_length": 21}),
    ("truncate_left_30_non_ascii", [ans("四月卖了48个，五月卖了一半24个，总共72个"), FINAL],
     {"max_tool_response_length": 30, "tool_response_truncate_side": "left"}),
    ("truncate_exact_len_not_cut", [ans("72"), FINAL], {"max_tool_response_length": 37}),
    ("tool_call_unclosed", ['<tool_call>\n{"name": "calc_gsm8k_reward", "arguments": {"answer": "72"}}'], {}),
    ("tool_call_valid_then_unclosed", [ans("70") + "\n<tool_call>\n" + '{"name": "calc_gsm8k_reward"', FINAL], {}),
    ("tool_call_tags_reversed", ['</tool_call> oops <tool_call>\n{"name": "calc_gsm8k_reward", "arguments": {}}'], {}),
    ("empty_generation", [("", CUT)], {}),
]


# Interaction cases: (name, turn texts, overrides, interaction_kwargs). "len_turn0" / "reject" / "accept" in a
# response_length expression are the first turn's length and the user-block lengths of Gsm8kInteraction's replies.
IK = {"name": "gsm8k", "query": QUESTION, "ground_truth": "72"}
W, R = "#### 70", "#### 72"
INTERACTION_CASES = [
    ("ia_wrong_then_right", [W, R], {}, IK),
    ("ia_right_at_once", [R], {}, IK),
    ("ia_no_hashes_then_right", ["The answer is 72", R], {}, IK),
    ("ia_tool_then_text", [THINK + ans("72"), FINAL], {}, IK),
    ("ia_tool_with_answer_text_then_text", [R + "\n" + ans("72"), FINAL], {}, IK),
    ("ia_tool_then_wrong_then_right", [ans("70"), W, R], {}, IK),
    ("ia_always_wrong_max_assistant_3", [W] * 5, {"max_assistant_turns": 3}, IK),
    ("ia_always_wrong_max_user_2", [W] * 5, {"max_user_turns": 2}, IK),
    ("ia_first_turn_fills_budget", [W, R], {"response_length": "len_turn0"}, IK),
    ("ia_reject_overflows_budget", [W, R], {"response_length": "len_turn0+reject-1"}, IK),
    ("ia_reject_exactly_fills_budget", [W, R], {"response_length": "len_turn0+reject"}, IK),
    ("ia_reject_fits_one_spare", [W, R], {"response_length": "len_turn0+reject+1"}, IK),
    ("ia_accept_overflows_budget", [R], {"response_length": "len_turn0+accept-1"}, IK),
    ("ia_reject_overflows_small_budget_16", [W, R], {"response_length": 16}, IK),
    ("ia_answer_comma_7_2", ["#### 7,2"], {}, IK),
    ("ia_answer_dollar_72", ["#### $72", R], {}, IK),
    ("ia_answer_trailing_dot", ["#### 72.", R], {}, IK),
    ("ia_answer_last_wins", ["#### 72\nno wait\n#### 70", "#### 70\nno wait\n#### 72"], {}, IK),
    ("ia_answer_then_200_cjk", [R + "答" * 200], {"response_length": 2048}, IK),
    ("ia_answer_then_300_ascii", [R + " x" * 150, R], {"response_length": 2048}, IK),
    ("ia_cut_no_eos_then_right", [(W, CUT), R], {}, IK),
    ("ia_empty_then_right", [("", CUT), R], {}, IK),
    ("ia_unparsed_tool_call_scored", ['#### 72\n<tool_call>\n{"name": calc_gsm8k_reward}\n</tool_call>'], {}, IK),
    ("ia_ground_truth_70", [R, W], {}, {**IK, "ground_truth": "70"}),
    ("ia_error_missing_name", [R], {}, {"query": QUESTION, "ground_truth": "72"}),
    ("ia_error_unknown_name", [R], {}, {**IK, "name": "math"}),
]
REJECT = "Your response is incorrect! You need to reflect on your answer and try again."
ACCEPT = "Your response is correct!"


def encode_turn(t):
    text, cut = (t[0], True) if isinstance(t, tuple) else (t, False)
    return text, not cut, tok.encode(text, add_special_tokens=False) + ([] if cut else [EOS])


class ScriptedServer:
    """Fake AsyncLLMServerManager: each request_id walks its own copy of the scripted turns."""

    def __init__(self, turns):
        self.turns, self.counter, self.served = turns, {}, []

    async def generate(self, request_id, *, prompt_ids, sampling_params, image_data=None, video_data=None):
        i = self.counter.get(request_id, 0)
        self.counter[request_id] = i + 1
        ids = list(self.turns[i])
        self.served.append(ids)
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), num_preempted=None, routed_experts=None)


def make_loop(server, mt, response_length, interaction_config_path=None):
    cfg = OmegaConf.create({"actor_rollout_ref": {"rollout": {
        "prompt_length": 1024, "response_length": response_length,
        "multi_turn": {**mt, "tool_config_path": TOOL_YAML, "format": "hermes",
                       "interaction_config_path": interaction_config_path},
    }}})
    # Real __init__ (AgentLoopBase + ToolAgentLoop). Built inside the running event loop, as AgentLoopWorker does.
    return ToolAgentLoop(DictConfigWrap(cfg), server, tok, None,
                         dataset_cls=RLHFDataset, dataset_config=DictConfigWrap(OmegaConf.create({})))


async def block_len(role, content):
    """Token length of a stripped single-message block (as the tool / interacting paths append it)."""
    loop = make_loop(None, MT_DEFAULTS, 256)
    return len(await loop.apply_chat_template([{"role": role, "content": content}], remove_system_prompt=True))


async def tool_block_len():
    """Token length of the stripped tool message for the standard right-answer tool text."""
    return await block_len("tool", "Current parsed answer='72' reward=1.0")


async def run_case(name, turn_specs, over, tool_len, interaction_kwargs=None, lens=None):
    mt = {**MT_DEFAULTS, **{k: v for k, v in over.items() if k in MT_DEFAULTS}}
    encoded = [encode_turn(t) for t in turn_specs]
    rl = over.get("response_length", 256)
    if isinstance(rl, str):  # budget relative to the first turn / the tool block, e.g. "len_turn0+tool-1"
        rl = rl.replace("len_turn0", str(len(encoded[0][2]))).replace("tool", str(tool_len))
        for k, v in (lens or {}).items():
            rl = rl.replace(k, str(v))
        rl = eval(rl)
    server = ScriptedServer([e[2] for e in encoded])
    ia = interaction_kwargs is not None
    loop = make_loop(server, mt, rl, INTERACTION_YAML if ia else None)
    tool_texts, orig_call_tool = [], loop._call_tool

    async def spy_call_tool(tool_call, tools_kwargs, agent_data):  # record tool texts in call order
        slot = len(tool_texts)
        tool_texts.append(None)
        resp = await orig_call_tool(tool_call, tools_kwargs, agent_data)
        tool_texts[slot] = resp[0].text
        return resp

    loop._call_tool = spy_call_tool
    if not ia:
        out = await loop.run({"temperature": 1.0}, raw_prompt=MESSAGES, tools_kwargs=TOOLS_KWARGS)
        return loop, {
            "name": name, "messages": MESSAGES, "tools_kwargs": TOOLS_KWARGS, "multi_turn": mt,
            "response_length": rl, "turn_texts": [e[0] for e in encoded], "turn_eos": [e[1] for e in encoded],
            "turns": server.served, "generate_calls": len(server.served),
            "prompt_ids": out.prompt_ids, "response_ids": out.response_ids, "response_mask": out.response_mask,
            "response_logprobs": out.response_logprobs, "num_turns": out.num_turns,
            "tool_rewards": out.extra_fields["tool_rewards"], "tool_texts": tool_texts, "interaction": False,
        }

    seen = []  # last assistant content scored by each generate_response call (spy on the real instance)
    for inter in loop.interaction_map.values():
        def spy_generate_response(instance_id, messages, _orig=inter.generate_response, **kw):
            seen.append(next((m["content"] for m in reversed(messages) if m.get("role") == "assistant"), ""))
            return _orig(instance_id, messages, **kw)
        inter.generate_response = spy_generate_response

    head = {"name": name, "messages": MESSAGES, "tools_kwargs": TOOLS_KWARGS, "multi_turn": mt, "response_length": rl,
            "interaction_kwargs": interaction_kwargs, "interaction": True}
    try:
        out = await loop.run({"temperature": 1.0}, raw_prompt=MESSAGES, tools_kwargs=TOOLS_KWARGS,
                             extra_info={"interaction_kwargs": interaction_kwargs})
    except Exception as e:  # noqa: BLE001
        return loop, {**head, "error": str(e), "error_type": type(e).__name__, "generate_calls": len(server.served)}
    return loop, {
        **head, "turn_texts": [e[0] for e in encoded], "turn_eos": [e[1] for e in encoded],
        "turns": server.served, "generate_calls": len(server.served),
        "prompt_ids": out.prompt_ids, "response_ids": out.response_ids, "response_mask": out.response_mask,
        "response_logprobs": out.response_logprobs, "num_turns": out.num_turns,
        "tool_rewards": out.extra_fields["tool_rewards"], "tool_texts": tool_texts,
        "turn_scores": out.extra_fields["turn_scores"], "interaction_inputs": seen,
    }


async def run_all():
    tool_len = await tool_block_len()
    cases, loop = [], None
    for name, turns, over in CASES:
        loop, c = await run_case(name, turns, over, tool_len)
        cases.append(c)
    tool_loop = loop
    lens = {"reject": await block_len("user", REJECT), "accept": await block_len("user", ACCEPT)}
    for name, turns, over, ik in INTERACTION_CASES:
        _, c = await run_case(name, turns, over, tool_len, interaction_kwargs=ik, lens=lens)
        cases.append(c)
    return tool_loop, cases


def search_texts():
    """verl's perform_single_search_batch with call_search_api monkeypatched to canned responses."""
    doc = lambda t, body, s: {"document": {"id": t, "contents": f'"{t}"\n{body}'}, "score": s}  # noqa: E731
    scenarios = [
        (["capital of France", "tallest mountain"],
         ({"result": [[doc("Paris", "text line1\ntext line2", 0.9), doc("France", "text line1\ntext line2", 0.8)],
                      [doc("Everest", "text line1\ntext line2", 0.7), doc("K2", "text line1\ntext line2", 0.6)]]}, None)),
        (["nothing matches"], ({"result": []}, None)),
        (["broken"], (None, "some error")),
        (["東京の人口"], ({"result": [[doc("東京", "人口は約1400万人です。\nÉté — “quoted”", 0.5)]]}, None)),
        (["title only"], ({"result": [[{"document": {"contents": "Just a title"}}]]}, None)),
    ]
    out = []
    for queries, (resp, err) in scenarios:
        sr.call_search_api = lambda *a, _r=(resp, err), **k: _r
        text, _meta = sr.perform_single_search_batch("http://unused/retrieve", queries, topk=2)
        out.append({"queries": queries, "api_response": resp, "error": err, "result_text": text})
    return out


def main():
    loop, cases = asyncio.run(run_all())
    golden = {
        "source": "verl b178a3cd ToolAgentLoop.run (real __init__ from an OmegaConf config, real Gsm8kTool from "
                  "examples/sglang_multiturn/config/tool_config/gsm8k_tool_config.yaml, real HermesToolParser, "
                  "AgentLoopBase.apply_chat_template with processor=None) driven by a scripted server_manager "
                  "(TokenOutput, log_probs -0.5/token); interaction cases also load the real Gsm8kInteraction from "
                  "examples/sglang_multiturn/config/interaction_config/gsm8k_interaction_config.yaml; shims: transformers 5 AutoModelForVision2Seq alias, "
                  "apply_chat_template return_dict=False (transformers-4 list return); see make_tool_agent_golden.py",
        "tokenizer": "PreTrainedTokenizerFast(qwen2_5_tokenizer.json) + qwen2_5.jinja, eos <|im_end|>, "
                     "pad <|endoftext|>, apply_chat_template_kwargs {}",
        "tool_schemas": loop.tool_schemas, "system_prompt_ids": loop.system_prompt, "eos_id": EOS,
        "cases": cases, "search_texts": search_texts(),
    }
    with open(os.path.join(HERE, "tool_agent_golden.json"), "w") as f:
        json.dump(golden, f, ensure_ascii=False, indent=1)
        f.write("\n")
    for c in cases:
        if "error" in c:
            print(f"{c['name']:34s} ERROR {c['error_type']}: {c['error']}")
            continue
        print(f"{c['name']:34s} gen={c['generate_calls']} turns={c['num_turns']} resp={len(c['response_ids'])} "
              f"rl={c['response_length']} rewards={c['tool_rewards']} tools={c['tool_texts']}"
              + (f" scores={c['turn_scores']}" if c["interaction"] else ""))


if __name__ == "__main__":
    main()
