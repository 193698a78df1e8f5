"""Reinforge's W&B sidecar: the official `wandb` package, fed by the trainer over stdin.

Protocol (one JSON object per line):
  in, first line:  {"project", "name", "dir", "config", "resume_id"}
  out:             "READY <run id>"  or  "ERROR <one line>" (then exit 3)
  in, then:        {"step": N, "metrics": {...}}  ...  {"end": "finished" | "failed" | "superseded"}
End of input without an "end" line counts as a failed run. "superseded": the trainer lost its run
directory to another process, which resumed this W&B run; this process is marked preempting
(W&B's record for a run stopped so that it can continue elsewhere) before it closes, so that
what it logged is kept without it being the run's last word as "failed".
"""
import json
import os
import sys


def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main():
    first = sys.stdin.readline()
    try:
        start = json.loads(first)
    except ValueError:
        say("ERROR the trainer sent no start line")
        return 3
    try:
        import wandb
    except ImportError as e:
        say(f"ERROR the `wandb` package is not installed for {sys.executable} ({e}): pip install wandb, or set REINFORGE_PYTHON to a Python that has it")
        return 3
    mode = os.environ.get("WANDB_MODE", "online").lower()
    if mode not in ("offline", "disabled", "dryrun"):
        try:
            ok = wandb.login(prompt=False, verify=False)
        except Exception as e:  # a malformed key
            say(f"ERROR {type(e).__name__}: {e}")
            return 3
        if not ok:
            say("ERROR no W&B API key: export WANDB_API_KEY=... (or run `wandb login` once), or WANDB_MODE=offline to log locally and `wandb sync` later")
            return 3
    try:
        run = wandb.init(
            project=start["project"],
            name=start["name"],
            dir=start["dir"],
            config=start.get("config") or {},
            id=start.get("resume_id") or None,
            resume="allow" if start.get("resume_id") else None,
            # Our stdout is the protocol pipe: W&B must not wrap it.
            settings=wandb.Settings(console="off"),
        )
    except Exception as e:
        say(f"ERROR wandb.init: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        return 3
    say(f"READY {run.id}")
    ending = "failed"
    for line in sys.stdin:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if "end" in msg:
            ending = msg["end"]
            break
        try:
            run.log(msg["metrics"], step=int(msg["step"]))
        except Exception as e:
            sys.stderr.write(f"wandb: step {msg.get('step')}: {type(e).__name__}: {e}\n")
    if ending == "superseded":
        run.mark_preempting()
    run.finish(exit_code=0 if ending == "finished" else 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
