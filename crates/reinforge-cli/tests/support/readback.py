"""Test oracle: reads back what a run sent to W&B (an offline run directory) and to MLflow
(a tracking server), with the trackers' own Python packages, and prints one JSON document.

  readback.py wandb RUN_DIR           -> {"project", "name", "config", "history": [{"step", ...}],
                                          "runs", "endings": [{"exit_code", "preempting"}] per log}
  readback.py mlflow URI RUN_ID KEY   -> {"status", "run_name", "params", "history": [{"step", "value"}]}

wandb >= 0.2x writes its `.wandb` transaction log from a Go binary and no longer ships a Python
reader for it, so the log's framing (LevelDB-style 32 KiB blocks of CRC-checked records) is
decoded here; each record is wandb's own protobuf `Record`.
"""
import glob
import json
import os
import struct
import sys
import zlib


def wandb_records(path):
    from wandb.proto import wandb_internal_pb2 as pb

    data = open(path, "rb").read()
    ident, magic, _version = struct.unpack_from("<4sHB", data, 0)
    assert ident == b":W&B" and magic == 0xBEE1, f"{path}: not a W&B log"
    pos, pending, block = 7, None, 32768
    while True:
        space = block - pos % block
        if space < 7:
            pos += space
            continue
        if pos + 7 > len(data):
            return
        crc, length, kind = struct.unpack_from("<IHB", data, pos)
        if (crc, length, kind) == (0, 0, 0):
            pos += space
            continue
        payload = data[pos + 7 : pos + 7 + length]
        if len(payload) < length:
            return
        pos += 7 + length
        assert zlib.crc32(payload, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF == crc, "CRC mismatch"
        if kind == 1:
            whole = payload
        elif kind == 2:
            pending, whole = bytearray(payload), None
        elif kind == 3:
            pending += payload
            whole = None
        else:
            whole, pending = bytes(pending + payload), None
        if whole is not None:
            rec = pb.Record()
            rec.ParseFromString(whole)
            yield rec


def key(item):
    return item.key or "/".join(item.nested_key)


def wandb_run(run_dir):
    logs = sorted(glob.glob(os.path.join(run_dir, "wandb", "offline-run-*", "run-*.wandb")), key=os.path.getmtime)
    assert logs, f"no offline W&B run under {run_dir}/wandb"
    out = {"project": None, "name": None, "config": {}, "history": [], "runs": len(logs), "endings": []}
    for log in logs:
        ending = {"exit_code": None, "preempting": False}
        out["endings"].append(ending)
        for rec in wandb_records(log):
            kind = rec.WhichOneof("record_type")
            if kind == "exit":
                ending["exit_code"] = rec.exit.exit_code
            elif kind == "preempting":
                ending["preempting"] = True
            elif kind == "run":
                out["project"], out["name"] = rec.run.project, rec.run.display_name
                for it in rec.run.config.update:
                    out["config"][key(it)] = json.loads(it.value_json)
            elif kind == "config":
                for it in rec.config.update:
                    out["config"][key(it)] = json.loads(it.value_json)
            elif kind == "history":
                row = {key(it): json.loads(it.value_json) for it in rec.history.item}
                row["step"] = rec.history.step.num if rec.history.HasField("step") else row.get("_step")
                out["history"].append(row)
    return out


def mlflow_run(uri, run_id, metric):
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(run_id)
    hist = sorted(client.get_metric_history(run_id, metric), key=lambda m: (m.step, m.timestamp))
    return {
        "status": run.info.status,
        "run_name": run.info.run_name,
        "experiment": client.get_experiment(run.info.experiment_id).name,
        "params": dict(run.data.params),
        "history": [{"step": m.step, "value": m.value} for m in hist],
    }


if __name__ == "__main__":
    if sys.argv[1] == "wandb":
        print(json.dumps(wandb_run(sys.argv[2])))
    else:
        print(json.dumps(mlflow_run(sys.argv[2], sys.argv[3], sys.argv[4])))
