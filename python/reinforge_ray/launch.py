"""Places Reinforge worker ranks on a Ray cluster and supervises them.

This is the only Python in Reinforge (DESIGN.md §2). The Rust controller (`reinforge train
--ray`) starts this script, reads events from its stdout and writes one JSON spec to its stdin:

  stdout  "@@reinforge {json}" lines: {"event": "driver", "node_ip"}, {"event": "placed", ...},
          {"event": "ready"}, {"event": "lost", ...}, {"event": "error", "message"}
          (other lines are Ray's forwarded worker logs and are passed through by the controller)
  stdin   optionally {"probe": {"cmd": [...], "rounds": [[args], ...], "timeout_s": N}} lines first:
          each runs cmd + args on every alive node, one round after the other, and is answered
          by {"event": "probed", "nodes": [...]} (`reinforge doctor` and the preflight of
          `reinforge train --ray`), and {"services": {"action": "start"|"stop"|"status", "name",
          "cmd": [...], "port", "timeout_s"}} lines: one detached actor per alive node holding a
          long-lived process (`reinforge retrieval serve --cluster`), answered by
          {"event": "services", "nodes": [{node_ip, ok, message}]}; then
          {"groups": [{"name", "nnodes", "ranks_per_node", "cpus_per_rank", "gpus_per_rank"}],
           "worker_cmd": [...], "env": {...}, "placement_timeout_s": N}
          then EOF when the controller exits: every rank is killed and the script ends.

One placement group per worker group, one bundle per node (STRICT_SPREAD over `nnodes` nodes),
one Ray actor per rank in its node's bundle. Each actor starts `worker_cmd` as a child process
with REINFORGE_GROUP/REINFORGE_RANK set and CUDA_VISIBLE_DEVICES from Ray's GPU assignment;
the worker dials the controller itself, so no data goes through Ray.
"""

import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import threading
import time

_out_lock = threading.Lock()


def emit(event, **fields):
    with _out_lock:
        sys.stdout.write("@@reinforge " + json.dumps({"event": event, **fields}) + "\n")
        sys.stdout.flush()


# Every Ray API used below, checked at once: a Ray outside the supported range that lacks one
# is named in one line instead of failing mid-placement.
try:
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

    for _api in ("get_gpu_ids", "get_runtime_context", "nodes", "kill", "wait"):
        if not hasattr(ray, _api):
            raise ImportError("ray.%s" % _api)
except ImportError as _e:
    _version = sys.modules["ray"].__version__ if "ray" in sys.modules else "missing"
    emit("error", message="Ray %s lacks %s, which Reinforge needs; install Ray 2.41 or newer on every node (`pip install -r python/requirements.txt` gives the tested one)" % (_version, getattr(_e, "name", None) or str(_e)))
    sys.exit(2)


@ray.remote(max_concurrency=4)
class RankWorker:
    """Holds one `reinforge worker` process; its lifetime is the actor's."""

    def __init__(self, cmd, env):
        full_env = dict(os.environ)
        full_env.update(env)
        gpus = ray.get_gpu_ids()
        full_env["CUDA_VISIBLE_DEVICES"] = ",".join(str(int(g)) for g in gpus)
        full_env["REINFORGE_NODE_IP"] = ray.util.get_node_ip_address()
        self.proc = subprocess.Popen(cmd, env=full_env)

    def info(self):
        return {
            "node_ip": ray.util.get_node_ip_address(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "pid": self.proc.pid,
            "gpus": [str(g) for g in ray.get_gpu_ids()],
        }

    def wait(self):
        return self.proc.wait()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        return True


@ray.remote(num_cpus=0, max_restarts=0)
class ServiceWorker:
    """Holds one long-lived service process on its node (`reinforge retrieval serve`); a
    detached actor, so it outlives the launcher that started it."""

    def __init__(self, cmd, port):
        env = dict(os.environ)
        env["REINFORGE_NODE_IP"] = ray.util.get_node_ip_address()
        self.port = port
        self.err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=self.err)

    def _tail(self):
        self.err.seek(0)
        lines = [l for l in self.err.read().decode(errors="replace").splitlines() if l.strip()]
        return lines[-1][:300] if lines else ""

    def ready(self, timeout_s):
        """Waits until the service accepts connections on its port, or says why not."""
        ip = ray.util.get_node_ip_address()
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            code = self.proc.poll()
            if code is not None:
                return {"node_ip": ip, "ok": False, "message": "exited with code %d: %s" % (code, self._tail())}
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return {"node_ip": ip, "ok": True, "pid": self.proc.pid, "message": "listening on port %d" % self.port}
            except OSError:
                time.sleep(0.2)
        return {"node_ip": ip, "ok": False, "message": "not listening on port %d after %ss: %s" % (self.port, timeout_s, self._tail())}

    def stop(self):
        """SIGTERM (the service finishes what it serves), then SIGKILL after 10 s."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.poll()


def services(p):
    """Starts, stops or lists one named service on every alive node (one detached actor each)."""
    name, action = p["name"], p["action"]
    timeout = p.get("timeout_s", 120)
    out = []
    for n in [n for n in ray.nodes() if n.get("Alive")]:
        node_ip, node_id = n.get("NodeManagerAddress"), n["NodeID"]
        actor_name = "reinforge-service:%s:%s" % (name, node_id)
        try:
            existing = ray.get_actor(actor_name, namespace="reinforge")
        except ValueError:
            existing = None
        try:
            if action == "start":
                if existing is not None:
                    r = ray.get(existing.ready.remote(5), timeout=30)
                    r["message"] = "already running (%s)" % r["message"]
                else:
                    a = ServiceWorker.options(
                        name=actor_name, namespace="reinforge", lifetime="detached",
                        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
                    ).remote(p["cmd"], p["port"])
                    r = ray.get(a.ready.remote(timeout), timeout=timeout + 30)
                    if not r["ok"]:
                        ray.kill(a, no_restart=True)
            elif action == "stop":
                if existing is None:
                    r = {"node_ip": node_ip, "ok": True, "message": "not running"}
                else:
                    ray.get(existing.stop.remote(), timeout=30)
                    ray.kill(existing, no_restart=True)
                    r = {"node_ip": node_ip, "ok": True, "message": "stopped"}
            else:
                r = {"node_ip": node_ip, "ok": existing is not None, "message": "running" if existing is not None else "not running"}
        except Exception as e:  # noqa: BLE001 - each node's failure is reported, the others go on
            msg = [l for l in str(e).strip().splitlines() if l.strip()]
            r = {"node_ip": node_ip, "ok": False, "message": (msg[0] if msg else type(e).__name__)[:300]}
        r.setdefault("node_ip", node_ip)
        out.append(r)
    return {"name": name, "action": action, "nodes": out}


@ray.remote(num_cpus=0, max_retries=0)
def run_probe(cmd, timeout_s):
    """One probe round on the node this task is pinned to (zero CPUs: busy nodes answer too)."""
    env = dict(os.environ)
    env["REINFORGE_NODE_IP"] = ray.util.get_node_ip_address()
    out = {"python": platform.python_version(), "ray": ray.__version__}
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
        out.update(code=p.returncode, stdout=p.stdout, stderr=p.stderr[-2000:])
    except Exception as e:  # noqa: BLE001 - a missing binary is a finding, not a crash
        # 127 as a shell says it: the command could not run (-1 means Ray could not run the task).
        out.update(code=127, stdout="", stderr="%s: %s" % (type(e).__name__, e))
    return out


def probe_nodes(p, gcs, dashboard):
    """Runs every round on every alive node; a round starts when the previous one ended."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    timeout = p.get("timeout_s", 60)
    results = {n["NodeID"]: [] for n in nodes}
    for args in p["rounds"]:
        # A node that missed a round (dead, or its probe cannot run) is not asked again.
        refs = {
            n["NodeID"]: run_probe.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=n["NodeID"], soft=False)
            ).remote(p["cmd"] + args, timeout)
            for n in nodes
            if all(r.get("code") == 0 for r in results[n["NodeID"]])
        }
        pending = list(refs.values())
        ray.wait(pending, num_returns=len(pending), timeout=timeout + 10)
        for node_id, ref in refs.items():
            try:
                results[node_id].append(ray.get(ref, timeout=0.1))
            except Exception as e:  # noqa: BLE001
                msg = [l for l in str(e).strip().splitlines() if l.strip()]
                why = "no answer within %ss" % timeout if isinstance(e, ray.exceptions.GetTimeoutError) else (msg[0] if msg else type(e).__name__)
                results[node_id].append({"code": -1, "stdout": "", "stderr": why[:300]})
    return {
        "nodes": [
            {
                "node_ip": n.get("NodeManagerAddress"),
                "node_id": n["NodeID"],
                "cpus": n.get("Resources", {}).get("CPU", 0),
                "gpus": n.get("Resources", {}).get("GPU", 0),
                "raylet_port": n.get("NodeManagerPort"),
                "rounds": results[n["NodeID"]],
            }
            for n in nodes
        ],
        "python": platform.python_version(),
        "ray": ray.__version__,
        "gcs": gcs,
        "dashboard": dashboard,
    }


def cluster_summary():
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    parts = []
    for n in nodes:
        r = n.get("Resources", {})
        parts.append("%s: %g CPU, %g GPU" % (n.get("NodeManagerAddress"), r.get("CPU", 0), r.get("GPU", 0)))
    return "%d alive node(s) (%s)" % (len(nodes), "; ".join(parts))


def check_feasible(groups):
    """Fails early, with numbers, when no assignment of nodes can hold the groups."""
    free = []
    for n in ray.nodes():
        if n.get("Alive"):
            r = n.get("Resources", {})
            free.append([r.get("CPU", 0.0), r.get("GPU", 0.0)])
    # Largest demands first onto the emptiest nodes: a placement exists when this greedy finds one
    # for the shapes we create (identical bundles per group).
    need = []
    for g in groups:
        per_node = (g["ranks_per_node"] * g["cpus_per_rank"], g["ranks_per_node"] * g["gpus_per_rank"])
        need.append((g["name"], g["nnodes"], per_node))
    need.sort(key=lambda x: (-x[2][1], -x[2][0]))
    for name, nnodes, (cpu, gpu) in need:
        fits = [i for i, f in enumerate(free) if f[0] + 1e-9 >= cpu and f[1] + 1e-9 >= gpu]
        if len(fits) < nnodes:
            return (
                "cannot place worker group '%s': it needs %d node(s) with %g CPU and %g GPU free each, "
                "the cluster has %s; lower its nnodes/ranks, add nodes, or colocate roles"
                % (name, nnodes, cpu, gpu, cluster_summary())
            )
        fits.sort(key=lambda i: (-free[i][1], -free[i][0]))
        for i in fits[:nnodes]:
            free[i][0] -= cpu
            free[i][1] -= gpu
    return None


def _route_source(host):
    """The local address the kernel would send from to reach `host` (a UDP connect sends nothing)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, 9))
            return s.getsockname()[0]
    except OSError:
        return None


def connect(address):
    """ray.init on the node this process runs on.

    Older Ray (2.41) finds a driver's node through the session files of the temp dir the
    cluster registered last; where hosts share a filesystem (containers, network namespaces)
    that is another node's raylet, and the driver dies on a port taken on this host. There,
    name this host's address on the route to the GCS, when Ray accepts it as a node.
    """
    opts = dict(log_to_driver=True, logging_level="ERROR", namespace="reinforge")
    if hasattr(getattr(ray._private, "node", None) and ray._private.node.Node, "_wait_and_get_for_node_address"):
        try:
            gcs = ray._private.services.canonicalize_bootstrap_address(address)
        except Exception:  # noqa: BLE001 - ray.init below says what is wrong with the address
            gcs = None
        mine = _route_source(gcs.rsplit(":", 1)[0]) if gcs else None
        if mine:
            try:
                return ray.init(address=gcs, _node_ip_address=mine, **opts)
            except Exception:  # noqa: BLE001 - not a node's address: let Ray find the node
                ray.shutdown()
    return ray.init(address=address, **opts)


def main():
    address = os.environ.get("REINFORGE_RAY_ADDRESS") or "auto"
    try:
        ctx = connect(address)
    except Exception as e:  # noqa: BLE001 - every failure becomes one line for the controller
        emit("error", message="cannot connect to the Ray cluster at %s: %s" % (address, str(e).splitlines()[0] if str(e) else type(e).__name__))
        return 2
    gcs = ray.get_runtime_context().gcs_address or ""
    dashboard = (getattr(ctx, "dashboard_url", "") or "").replace("http://", "").rstrip("/")
    emit("driver", node_ip=ray.util.get_node_ip_address(), cluster=cluster_summary(), gcs=gcs, dashboard=dashboard)

    while True:
        line = sys.stdin.readline()
        if not line:
            return 0
        spec = json.loads(line)
        if "services" in spec:
            emit("services", **services(spec["services"]))
            continue
        if "probe" not in spec:
            break
        emit("probed", **probe_nodes(spec["probe"], gcs, dashboard))
    groups = spec["groups"]
    problem = check_feasible(groups)
    if problem:
        emit("error", message=problem)
        return 3

    pgs, actors, places = [], [], {}
    try:
        # Biggest per-node demands first, as check_feasible assumed: Ray places one placement
        # group at a time, and small groups placed first can split the nodes a big one needs.
        order = sorted(groups, key=lambda g: (-g["ranks_per_node"] * g["gpus_per_rank"], -g["ranks_per_node"] * g["cpus_per_rank"]))
        for g in order:
            bundle = {"CPU": g["ranks_per_node"] * g["cpus_per_rank"]}
            if g["gpus_per_rank"] > 0:
                bundle["GPU"] = g["ranks_per_node"] * g["gpus_per_rank"]
            strategy = "STRICT_SPREAD" if g["nnodes"] > 1 else "STRICT_PACK"
            pg = placement_group([dict(bundle) for _ in range(g["nnodes"])], strategy=strategy, name="reinforge:" + g["name"])
            pgs.append(pg)
            ready, _ = ray.wait([pg.ready()], timeout=spec.get("placement_timeout_s", 60))
            if not ready:
                emit("error", message="worker group '%s' could not be placed within %ss (%d node(s) × %s); the cluster has %s"
                     % (g["name"], spec.get("placement_timeout_s", 60), g["nnodes"], bundle, cluster_summary()))
                return 3
            world = g["nnodes"] * g["ranks_per_node"]
            for rank in range(world):
                env = dict(spec.get("env", {}))
                env.update({"REINFORGE_GROUP": g["name"], "REINFORGE_RANK": str(rank), "REINFORGE_WORLD": str(world)})
                strat = PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=rank // g["ranks_per_node"])
                a = RankWorker.options(
                    name="reinforge:%s:%d" % (g["name"], rank),
                    num_cpus=g["cpus_per_rank"],
                    num_gpus=g["gpus_per_rank"],
                    scheduling_strategy=strat,
                    max_restarts=0,
                ).remote(spec["worker_cmd"], env)
                actors.append((g["name"], rank, a))
        for name, rank, a in actors:
            info = ray.get(a.info.remote(), timeout=spec.get("placement_timeout_s", 60))
            places[(name, rank)] = info
            emit("placed", group=name, rank=rank, **info)
        emit("ready")

        # Supervise: a rank whose process exits or whose node dies ends the run, named.
        stop = threading.Event()

        def watch_stdin():
            sys.stdin.read()
            stop.set()

        threading.Thread(target=watch_stdin, daemon=True).start()
        waits = {a.wait.remote(): (name, rank) for name, rank, a in actors}
        while not stop.is_set() and waits:
            done, _ = ray.wait(list(waits), num_returns=1, timeout=0.5)
            for ref in done:
                name, rank = waits.pop(ref)
                where = places.get((name, rank), {}).get("node_ip", "?")
                try:
                    code = ray.get(ref)
                    if not stop.is_set():
                        emit("exited", group=name, rank=rank, node_ip=where, code=code)
                except Exception as e:  # noqa: BLE001
                    msg = str(e).strip().splitlines()
                    emit("lost", group=name, rank=rank, node_ip=where,
                         message=(msg[0] if msg else type(e).__name__)[:300])
        return 0
    finally:
        for _, _, a in actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception:  # noqa: BLE001
                pass
        for pg in pgs:
            try:
                remove_placement_group(pg)
            except Exception:  # noqa: BLE001
                pass


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.exit(code)
