# Reinforge's host for a Python reward function (reinforge-reward's `kind = "python"`).
#
# argv: PATH FUNCTION STYLE KWARGS_JSON. PATH is a .py file, or pkg://module.name to import.
# Protocol on the process's original stdout, one JSON object per line: first
# {"ready": true} or {"error": "..."}; then, for each request line {"items": [...]} read
# from stdin, {"scores": [{"score": x, "details": {...}}, ...]} or {"error": "..."}.
# Whatever the user's code prints goes to stderr, so it cannot break the protocol.
import asyncio
import importlib
import importlib.util
import inspect
import json
import math
import os
import sys
import traceback

proto = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
os.dup2(2, 1)
sys.stdout = sys.stderr


def send(obj):
    proto.write(json.dumps(obj) + "\n")
    proto.flush()


def where(exc):
    frames = traceback.extract_tb(exc.__traceback__)
    return f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""


path, name, style, kwargs = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
try:
    if path.startswith("pkg://"):
        module = importlib.import_module(path[len("pkg://"):])
    else:
        # Sibling modules of the file import as they would next to it.
        sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
        spec = importlib.util.spec_from_file_location("custom_module", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["custom_module"] = module
        spec.loader.exec_module(module)
    fn = getattr(module, name)
    if not callable(fn):
        raise TypeError(f"`{name}` is not a function")
except Exception as e:  # noqa: BLE001 - any failure to load is the user's to see
    send({"error": f"cannot load `{name}` from {path}: {type(e).__name__}: {e}{where(e)}"})
    sys.exit(1)
send({"ready": True})


def number(x, what):
    x = plain(x, what)
    if not math.isfinite(x):
        raise ValueError(f"{what}: {x} is not a finite number")
    return x


def plain(x, what):
    if hasattr(x, "tolist"):
        x = x.tolist()
    while isinstance(x, (list, tuple)):
        if len(x) != 1:
            raise ValueError(f"{what}: expected one value per sample, got {len(x)}")
        x = x[0]
    if isinstance(x, (bool, int, float)):
        return float(x)
    if hasattr(x, "item"):
        return float(x.item())
    raise TypeError(f"{what}: expected a number, got {type(x).__name__} {x!r:.80}")


def numbers(d, prefix=""):
    out = {}
    for k, v in d.items():
        try:
            out[prefix + str(k)] = number(v, k)
        except (TypeError, ValueError):
            pass  # strings, lists of several values: not metrics
    return out


def call(*args, **kw):
    result = fn(*args, **{**kw, **kwargs})
    if inspect.isawaitable(result):
        result = asyncio.run(result)
    return result


def verl(item):
    # verl's naive reward manager: keyword arguments, the response alone, extra_info with the
    # two keys it adds.
    extra = item.get("extra_info")
    extra = {} if extra is None else extra
    if isinstance(extra, dict):
        extra.setdefault("num_turns", None)
        extra.setdefault("rollout_reward_scores", {})
    r = call(data_source=item["data_source"], solution_str=item["response"], ground_truth=item["ground_truth"], extra_info=extra)
    if isinstance(r, dict):
        if "score" not in r:
            raise KeyError(f"returned a dict without a 'score' key: {sorted(r)}")
        return {"score": number(r["score"], "score"), "details": numbers({k: v for k, v in r.items() if k != "score"})}
    return {"score": number(r, "the returned value")}


def openrlhf(item):
    # OpenRLHF's reward_func(queries, prompts, labels): one sample per call, as its
    # SingleTurnAgentExecutor makes them; the query is prompt + response.
    gt = item["ground_truth"]
    label = "" if gt is None else gt if isinstance(gt, str) else json.dumps(gt)
    r = call([item["prompt"] + item["response"]], [item["prompt"]], [label])
    if isinstance(r, dict):
        if "rewards" not in r:
            raise KeyError(f"returned a dict without a 'rewards' key: {sorted(r)}")
        details = numbers(r.get("extra_logs") or {})
        if r.get("scores") is not None:
            details["scores"] = number(r["scores"], "scores")
        return {"score": number(r["rewards"], "rewards"), "details": details}
    return {"score": number(r, "the returned value")}


score = verl if style == "verl" else openrlhf
for line in sys.stdin:
    items = json.loads(line)["items"]
    outs = []
    for i, item in enumerate(items):
        try:
            outs.append(score(item))
        except Exception as e:  # noqa: BLE001 - reported with the sample that raised it
            send({"error": f"`{name}` failed on item {i} of the batch (data_source {item.get('data_source')!r}): {type(e).__name__}: {e}{where(e)}"})
            break
    else:
        send({"scores": outs})
