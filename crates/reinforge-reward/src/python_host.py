# Reinforge's host for a Python reward function (reinforge-reward's `kind = "python"`).
#
# argv: PATH FUNCTION STYLE KWARGS_JSON. PATH is a .py file, or pkg://module.name to import.
# Protocol on the process's original stdout, one JSON object per line: first
# {"ready": true} or {"error": "..."}; then, for each request line {"items": [...]} read
# from stdin, {"progress": i} after each item (the caller times items, not batches), then
# {"scores": [{"score": x, "details": {...}}, ...]} or {"error": "..."}.
# Whatever the user's code prints goes to stderr, so it cannot break the protocol. The host
# runs in a process group of its own: a terminal's Ctrl-C is the trainer's to handle.
import asyncio
import importlib
import importlib.util
import inspect
import json
import math
import os
import signal
import sys
import threading
import time
import traceback

proto = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
os.dup2(2, 1)
sys.stdout = sys.stderr
sys.stdin.reconfigure(encoding="utf-8")


def end_group():
    # This process leads its group: the function's helpers go with it.
    os.killpg(0, signal.SIGKILL)


def watch_parent(parent):
    # A trainer that exits without stopping us (a second Ctrl-C, a crash) leaves us to init.
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            end_group()


threading.Thread(target=watch_parent, args=(os.getppid(),), daemon=True).start()

# One event loop for the process, as verl keeps one: async functions may hold clients,
# queues or locks bound to it across calls.
loop = asyncio.new_event_loop()
asyncio.set_event_loop(loop)


def send(obj):
    proto.write(json.dumps(obj) + "\n")
    proto.flush()


def where(exc):
    frames = traceback.extract_tb(exc.__traceback__)
    return f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""


def one_line(text):
    return " ".join(str(text).split())


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
    send({"error": one_line(f"cannot load `{name}` from {path}: {type(e).__name__}: {e}{where(e)}")})
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
        result = loop.run_until_complete(result)
    return result


def verl(item):
    # verl's naive reward manager: keyword arguments, the response alone, extra_info with the
    # two keys it sets (num_turns: the agent loop's count, which the trainer passes as
    # __num_turns__ for multi-turn rollouts; 2 for a single turn, as verl's agent loop counts).
    extra = item.get("extra_info")
    extra = {} if extra is None else extra
    if isinstance(extra, dict):
        extra["num_turns"] = extra.pop("__num_turns__", 2)
        extra["rollout_reward_scores"] = {}
    r = call(data_source=item["data_source"], solution_str=item["response"], ground_truth=item["ground_truth"], extra_info=extra)
    if isinstance(r, dict):
        if "score" not in r:
            raise KeyError(f"returned a dict without a 'score' key: {sorted(r)}")
        return {"score": number(r["score"], "score"), "details": numbers({k: v for k, v in r.items() if k != "score"})}
    return {"score": number(r, "the returned value")}


def openrlhf(item):
    # OpenRLHF's reward_func(queries, prompts, labels): one sample per call, as its
    # SingleTurnAgentExecutor makes them; the query is prompt + response, the label the
    # row's label column as it is ("" without one).
    gt = item["ground_truth"]
    label = "" if gt is None else gt
    r = call([item["prompt"] + item["response"]], [item["prompt"]], [label])
    if isinstance(r, dict):
        if "rewards" not in r:
            raise KeyError(f"returned a dict without a 'rewards' key: {sorted(r)}")
        details = numbers(r.get("extra_logs") or {})
        if r.get("scores") is not None:
            # OpenRLHF filters groups on `scores`: dynamic sampling's `score` metric reads it.
            details["score"] = number(r["scores"], "scores")
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
            send({"error": one_line(f"`{name}` failed on item {i} of the batch (data_source {item.get('data_source')!r}): {type(e).__name__}: {e}{where(e)}")})
            break
        send({"progress": i})
    else:
        send({"scores": outs})
# The trainer closed the pipe: done, and so is whatever the function started.
end_group()
