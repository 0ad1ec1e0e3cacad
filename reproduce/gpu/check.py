"""`make gpu-check`: the one command to run on a machine with a GPU (sized to fit in 8 minutes on one
modern GPU; not yet timed on one; nothing else needed).

1. NCCL world of one rank, every optimizer: 20 steps of ResNet-50 on synthetic ImageNet-shaped data.
2. gloo world of 4 ranks sharing that GPU (CUDA tensors; launch.device_plan's choice for more ranks than
   GPUs), every optimizer, 20 steps: device placement at P > 1.
3. ResNet-50 synthetic images/s through `wagma-bench run` against a plain torch loop of the same model and
   batch, as a ratio, in fp32 and with train.precision=bf16 (autocast + channels_last).
4. `wagma-bench comm-bench --device cuda`: our allreduce, group allreduce and wait-avoiding allreduce against
   the raw torch.distributed calls on CUDA tensors (CPU tensors in the dry run).
5. What the paper-scale simulator needs from a GPU: interleaved pairs of AD-PSGD (its gossip thread on) and
   local SGD with AD-PSGD's period (no thread), one rank per GPU, then reproduce/scaling/measure_inputs.py
   over them and step 4's comm-bench: the exchange's cost on the compute, the ranks' compute spread and its
   persistence, the intra-node link, written as measured-<host>-<time>-gpu.json, which `wagma-bench simulate
   --measured FILE` reads.

Prints a table and writes reproduce/gpu/check-<host>-<time>.json (GPU_CHECK_OUT=DIR to write elsewhere).
Without CUDA it says in one line which GPU measurements it skips and measures step 5 on the CPU instead (the
embedded ResNet-20, 2 ranks, gloo): measured-<host>-<time>-cpu.json, labelled cpu in the file. GPU_CHECK_DRY=1
runs steps 1-4's code paths on the CPU with 2 steps, tiny images, 2 optimizers and 2 ranks (the test suite
runs it, so the script cannot rot). GPU_CHECK_CPU_BATCH=N sets the per-rank batch of the CPU's step 5 (the
workload's 32 by default; the test suite's 8: the same runs, pairs and files, a quarter of the compute), and
GPU_CHECK_CPU_ROUNDS=N the rounds of each of its runs (40 by default; the test suite's 20).

The machine's own Python and torch (>= 2.3, with torchvision and numpy) run it from this repository; Hydra and
OmegaConf come from the machine or, offline, from the wheels that `make gpu-wheels` put in
reproduce/gpu/wheels/ (installed into reproduce/gpu/site/, nothing outside the repository changes).

    python reproduce/gpu/check.py          # or: make gpu-check
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
WHEELS, SITE = HERE / "wheels", HERE / "site"
# every optimizer of the registry (conf/optimizer/NAME.yaml, one per algorithm; read without importing torch)
OPTIMIZERS = sorted(p.stem for p in (ROOT / "conf" / "optimizer").glob("*.yaml"))


@dataclass(frozen=True)
class Sizes:
    steps: int  # training steps per run (rounded up by the trainer to an optimizer's sync period)
    warmup: int  # steps left out of the images/s figures (cuDNN autotuning, allocator growth)
    batch: int  # per rank, one rank per device
    shared_batch: int  # per rank, several ranks sharing one device
    image_size: int
    optimizers: tuple[str, ...]
    shared_ranks: int  # ranks of the gloo world on one device
    bench_sizes: str  # comm-bench message sizes
    timeout_s: int  # per command


FULL = Sizes(
    steps=20,
    warmup=5,
    batch=64,
    shared_batch=32,
    image_size=224,
    optimizers=tuple(OPTIMIZERS),
    shared_ranks=4,
    bench_sizes="1M,16M,100M",
    timeout_s=300,
)
# The wait-avoiding op (as WAGMA-SGD uses it) against the plain averaging allreduce of its group (NCCL's
# ReduceOp.AVG where the world is NCCL's), by message size: at most this ratio (the goal)
WAIT_AVOIDING_GOALS = {2**20: 1.5, 16 * 2**20: 1.15, 100 * 2**20: 1.15}
# dry: a gradient-averaging and a gossip (point-to-point) optimizer, both synchronising every step, so that
# 2 steps stay 2 steps (WAGMA's tau would round them up to 10)
DRY = Sizes(
    steps=2,
    warmup=1,
    batch=2,
    shared_batch=2,
    image_size=32,
    optimizers=("allreduce", "dpsgd"),
    shared_ranks=2,
    bench_sizes="1M",
    timeout_s=300,
)


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of `wagma-bench` runs: this repository (and the offline site) first on the path."""
    paths = [str(ROOT)] + ([str(SITE)] if SITE.exists() else [])
    old = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths + ([old] if old else [])), **(extra or {})}


def ensure_hydra() -> None:
    """Hydra and OmegaConf from this Python, else from `make gpu-wheels`' folder, installed into SITE."""
    try:
        import hydra  # noqa: F401
        import omegaconf  # noqa: F401

        return
    except ImportError:
        pass
    if not any(WHEELS.glob("*.whl")):
        sys.exit(
            "gpu-check: hydra-core/omegaconf missing and no wheels in reproduce/gpu/wheels (run `make "
            "gpu-wheels` on a machine with internet, copy the folder along)"
        )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--find-links",
            str(WHEELS),
            "--target",
            str(SITE),
            "hydra-core",
            "omegaconf",
        ],
        check=True,
    )
    sys.path.insert(0, str(SITE))


def wagma_bench(
    args: list[str], sizes: Sizes, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "wagma_bench", *args]
    print("$ wagma-bench " + " ".join(args), flush=True)
    try:
        return subprocess.run(
            cmd,
            cwd=ROOT,
            env=child_env(env),
            capture_output=True,
            text=True,
            timeout=sizes.timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as err:
        return subprocess.CompletedProcess(cmd, 124, err.stdout or "", f"timed out after {sizes.timeout_s} s")


def resnet50_args(sizes: Sizes, batch: int | None = None) -> list[str]:
    return [
        "workload=resnet",
        "data=synthetic",
        "workload.arch=resnet50",
        f"data.image_size={sizes.image_size}",
        f"train.batch_size={batch or sizes.batch}",
        f"train.max_rounds={sizes.steps}",
        "logger.progress=off",
    ]


def read_run(run_dir: Path) -> dict:
    """What the table needs from one run directory: status, steps, the backend it ran on, its error."""
    summary = run_dir / "summary.json"
    if not summary.exists():
        return {"status": "no summary", "steps": None, "backend": None, "error": None}
    s = json.loads(summary.read_text())
    start = next(
        (
            json.loads(line)
            for line in (run_dir / "events.jsonl").read_text().splitlines()
            if '"run_start"' in line
        ),
        {},
    )
    backend = start.get("metadata", {}).get("versions", {}).get("comm")
    rounds = s.get("rounds", s.get("steps"))  # a run recorded before 2026-12-06 says steps
    return {"status": s.get("status"), "steps": rounds, "backend": backend, "error": s.get("error")}


def every_optimizer(name: str, world: list[str], sizes: Sizes, out: Path, batch: int, env=None) -> dict:
    """One multirun over the optimizers in the given world; a row per optimizer."""
    sweep_dir = out / name
    done = wagma_bench(
        [
            "run",
            "-m",
            *resnet50_args(sizes, batch),
            *world,
            f"optimizer={','.join(sizes.optimizers)}",
            f"hydra.sweep.dir={sweep_dir}",
        ],
        sizes,
        env,
    )
    rows = {}
    for opt in sizes.optimizers:
        run_dir = next(iter(sweep_dir.glob(f"*_{opt}_s1")), sweep_dir / f"missing_{opt}")
        rows[opt] = read_run(run_dir)
        rows[opt]["ok"] = rows[opt]["status"] == "completed"
    return {
        "rows": rows,
        "exit": done.returncode,
        "stdout_head": done.stdout[:400],
        "stderr_tail": done.stderr[-2000:] if done.returncode else "",
    }


def images_per_s(run_dir: Path, batch: int, warmup: int) -> float | None:
    """Rank 0's training-clock images/s after the warm-up steps (steps/rank0.jsonl: `t` after each step)."""
    path = run_dir / "steps" / "rank0.jsonl"
    if not path.exists():
        return None
    t = [json.loads(line)["t"] for line in path.read_text().splitlines()]
    if len(t) <= warmup or t[-1] <= t[warmup - 1]:
        return None
    return (len(t) - warmup) * batch / (t[-1] - t[warmup - 1])


def plain_loop_images_per_s(sizes: Sizes, precision: str) -> float:
    """The same model and batch in a bare torch loop: SGD, one loss.item() per step as the trainer does."""
    import torch
    import torch.nn.functional as F
    import torchvision

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(1)
    bf16 = precision == "bf16"
    model = torchvision.models.resnet50(weights=None).to(device)
    fmt = torch.channels_last if bf16 else torch.contiguous_format
    model = model.to(memory_format=fmt)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    x = torch.randn(sizes.batch, 3, sizes.image_size, sizes.image_size, device=device).contiguous(
        memory_format=fmt
    )
    y = torch.randint(0, 1000, (sizes.batch,), device=device)
    t_start = None
    for step in range(sizes.steps):
        if step == sizes.warmup:
            t_start = time.perf_counter()
        opt.zero_grad()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        loss.item()  # synchronises, as the trainer's per-step loss read does
    return (sizes.steps - sizes.warmup) * sizes.batch / (time.perf_counter() - t_start)


def throughput(sizes: Sizes, out: Path) -> dict:
    """wagma-bench run (one rank, allreduce) vs the plain loop, fp32 and bf16."""
    rows, sweep_dir = {}, out / "throughput"
    done = wagma_bench(
        [
            "run",
            "-m",
            *resnet50_args(sizes),
            "launcher.nproc=1",
            "optimizer=allreduce",
            "train.precision=fp32,bf16",
            f"hydra.sweep.dir={sweep_dir}",
            "hydra.sweep.subdir=${train.precision}",
        ],
        sizes,
    )
    for precision in ("fp32", "bf16"):
        ours = images_per_s(sweep_dir / precision, sizes.batch, sizes.warmup)
        plain = plain_loop_images_per_s(sizes, precision)
        rows[precision] = {
            "wagma_bench_images_per_s": ours,
            "plain_images_per_s": plain,
            "ratio": ours / plain if ours else None,
            "exit": done.returncode,
            "ok": done.returncode == 0 and ours is not None,
            "stderr_tail": done.stderr[-2000:] if done.returncode else "",
        }
    return {"rows": rows}


def comm_bench(sizes: Sizes, out: Path, device: str) -> dict:
    """comm-bench over the GPUs (an NCCL world, one rank per GPU; with one GPU, 2 gloo ranks on CUDA tensors:
    NCCL refuses two ranks on one GPU), and the wait-avoiding op's ratio to the averaging allreduce against
    :data:`WAIT_AVOIDING_GOALS` (judged on NCCL only)."""
    import torch

    gpus = torch.cuda.device_count() if device == "cuda" else 0
    nproc = min(gpus, 8) if gpus >= 2 else 2
    path = out / "comm_bench.json"
    done = wagma_bench(
        [
            "comm-bench",
            "--nproc",
            str(nproc),
            "--sizes",
            sizes.bench_sizes,
            "--repeats",
            "5",
            "--device",
            device,
            "--out",
            str(path),
        ],
        sizes,
    )
    bench = json.loads(path.read_text()) if path.exists() else None
    table = bench["table"] if bench else None
    nccl = bench is not None and bench.get("backend") == "nccl"
    note = (
        "CUDA tensors, NCCL"
        if nccl
        else "CUDA tensors, gloo (one GPU: no NCCL world of 2)"
        if device == "cuda"
        else "CPU tensors (dry run)"
    )
    goals = []
    for row in table or []:
        goal = WAIT_AVOIDING_GOALS.get(row["bytes"])
        if row["op"] == "wait_avoiding" and goal is not None and "ratio_to_raw_mean" in row:
            goals.append(
                {
                    "group_size": row["group_size"],
                    "bytes": row["bytes"],
                    "ratio": row["ratio_to_raw_mean"],
                    "goal": goal,
                    "met": row["ratio_to_raw_mean"] <= goal,
                    "judged": nccl,
                }
            )
    return {
        "ok": done.returncode == 0 and table is not None,
        "exit": done.returncode,
        "device": device,
        "note": note,
        "table": table,
        "wait_avoiding_goals": goals,
        "stderr_tail": done.stderr[-2000:] if done.returncode else "",
    }


# step 5: pairs of runs per measurement, their length, and what a CPU-only machine cannot give
PAIRS, INPUT_STEPS, CPU_INPUT_STEPS = 2, 60, 40
GPU_MEASUREMENTS = (
    "NCCL worlds of every optimizer",
    "gloo worlds sharing a GPU",
    "ResNet-50 images/s against plain torch",
    "comm-bench on CUDA tensors",
    "the GPU ranks' compute spread",
    "AD-PSGD's exchange cost beside GPU compute",
    "the GPUs' intra-node link",
)


def model_inputs(
    out: Path, measured_on: str, bench_json: Path | None, skipped: list[str], timeout_s: int
) -> dict:
    """Step 5: the pairs, a comm-bench where step 4 gave none, and measure_inputs.py's file."""
    import torch

    gpus = torch.cuda.device_count() if measured_on == "gpu" else 0
    ranks = max(2, min(gpus, 8))
    sizes = dataclasses.replace(FULL, timeout_s=timeout_s)
    if measured_on == "gpu":
        common = [
            "workload=resnet",
            "data=synthetic",
            "workload.arch=resnet50",
            f"train.batch_size={FULL.batch}",
            f"train.max_rounds={INPUT_STEPS}",
        ] + (["comm.backend=nccl"] if gpus >= 2 else [])
    else:
        rounds = int(os.environ.get("GPU_CHECK_CPU_ROUNDS") or CPU_INPUT_STEPS)
        common = ["workload=resnet", f"train.max_rounds={rounds}"]
        if batch := os.environ.get("GPU_CHECK_CPU_BATCH"):  # the test suite's: the same path, less compute
            common.append(f"train.batch_size={int(batch)}")
    common += [
        f"launcher.nproc={ranks}",
        "imbalance=none",
        "logger.progress=off",
        "eval.target=null",
        "eval.every_rounds=100000",
        "checkpoint.every_s=100000",
    ]
    gossip = out / "gossip"
    for i in range(1, PAIRS + 1):  # interleaved: the machine's speed drifts
        for name, opt in (
            ("adpsgd", ["optimizer=adpsgd"]),
            ("nothread", ["optimizer=local_sgd", "optimizer.sync_period=10"]),
        ):
            wagma_bench(["run", *common, *opt, f"hydra.run.dir={gossip / f'{name}_p{ranks}_pair{i}'}"], sizes)
    if bench_json is None or not bench_json.exists():
        bench_json = out / "comm_bench_inputs.json"
        wagma_bench(
            [
                "comm-bench",
                "--nproc",
                str(ranks),
                "--sizes",
                "64K,1M,16M",
                "--repeats",
                "5",
                "--out",
                str(bench_json),
            ],
            sizes,
        )
    stamp = out.name.removeprefix("runs-")
    path = out.parent / f"measured-{socket.gethostname()}-{stamp}-{measured_on}.json"
    where = (
        f"{gpus} GPU(s) {torch.cuda.get_device_name(0)}"
        if measured_on == "gpu"
        else f"{os.cpu_count()} CPU cores, {ranks} gloo ranks, the embedded ResNet-20"
    )
    cmd = [
        sys.executable,
        str(ROOT / "reproduce" / "scaling" / "measure_inputs.py"),
        str(gossip),
        str(bench_json),
        "--out",
        str(path),
        "--measured-on",
        measured_on,
        "--source",
        where,
        "--skipped",
        *skipped,
    ]
    done = subprocess.run(
        cmd, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=timeout_s, check=False
    )
    return {
        "ok": done.returncode == 0 and path.exists(),
        "path": str(path),
        "measured_on": measured_on,
        "stdout": done.stdout[-400:],
        "stderr_tail": done.stderr[-2000:] if done.returncode else "",
    }


def format_report(result: dict) -> str:
    dry = " [DRY: CPU, tiny sizes]" if result["dry"] else ""
    lines = [f"gpu-check on {result['host']} ({result['device']}), torch {result['torch']}{dry}", ""]
    for part in ("nccl_one_rank", "gloo_shared_gpu"):
        lines.append(f"{part}:")
        for opt, row in result[part]["rows"].items():
            lines.append(
                f"  {opt:10s} {'ok  ' if row['ok'] else 'FAIL'} {row['status']!s:12s} steps={row['steps']} "
                f"backend={row['backend']}" + (f"  {row['error']}" if row["error"] else "")
            )
    lines.append("throughput (ResNet-50 synthetic images/s, one rank): wagma-bench / plain torch loop")
    for precision, row in result["throughput"]["rows"].items():
        ours, plain, ratio = row["wagma_bench_images_per_s"], row["plain_images_per_s"], row["ratio"]
        lines.append(
            f"  {precision:5s} {ours or 0:9.1f} / {plain:9.1f} = {ratio or 0:.3f}"
            f"{'' if row['ok'] else '  FAIL'}"
        )
    bench = result["comm_bench"]
    lines.append(f"comm-bench: {'ok' if bench['ok'] else 'FAIL'} ({bench['note']})")
    for g in bench.get("wait_avoiding_goals", []):
        verdict = ("met" if g["met"] else "NOT met") if g["judged"] else "not judged (not NCCL)"
        lines.append(
            f"  wait-avoiding S={g['group_size']} {g['bytes'] / 2**20:g} MiB: {g['ratio']:.3f}x the "
            f"averaging allreduce, goal at most {g['goal']}x: {verdict}"
        )
    inputs = result.get("model_inputs")
    if inputs:
        lines.append(
            f"model inputs ({inputs['measured_on']}-measured): {'ok' if inputs['ok'] else 'FAIL'} -> "
            f"{inputs['path']}"
        )
    lines.append(f"all ok: {result['ok']}  ({result['seconds']:.0f} s)")
    return "\n".join(lines)


def main() -> int:
    dry = os.environ.get("GPU_CHECK_DRY") == "1"
    try:
        import torch
    except ImportError:
        print(
            f"gpu-check: {sys.executable} has no torch; run it with the Python that has (GPU_PY=... make "
            "gpu-check)"
        )
        return 2

    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = Path(os.environ.get("GPU_CHECK_OUT", HERE)).resolve()
    work = out / f"runs-{stamp}"
    if not dry and not torch.cuda.is_available():
        print(
            f"gpu-check: no CUDA GPU visible to torch here: skipped {'; '.join(GPU_MEASUREMENTS)}; measuring "
            "the simulator's inputs on the CPU instead, labelled cpu (GPU_CHECK_DRY=1 runs the GPU steps' "
            "code on the CPU)",
            flush=True,
        )
        ensure_hydra()
        inputs = model_inputs(work, "cpu", None, list(GPU_MEASUREMENTS), FULL.timeout_s)
        print(
            f"gpu-check: {'wrote ' + inputs['path'] if inputs['ok'] else 'FAILED: ' + inputs['stderr_tail']}"
        )
        return 0 if inputs["ok"] else 1
    ensure_hydra()
    sizes = DRY if dry else FULL
    t0 = time.perf_counter()
    # one rank per run (nccl with CUDA); then ranks sharing the first GPU: device_plan picks gloo on CUDA
    # tensors
    one_rank = ["launcher.nproc=1"] + ([] if dry else ["comm.backend=nccl"])
    shared = (
        {} if dry else {"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]}
    )
    result = {
        "host": socket.gethostname(),
        "dry": dry,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "sizes": asdict(sizes),
        "nccl_one_rank": every_optimizer("nccl_one_rank", one_rank, sizes, work, sizes.batch),
        "gloo_shared_gpu": every_optimizer(
            "gloo_shared_gpu",
            [f"launcher.nproc={sizes.shared_ranks}"],
            sizes,
            work,
            sizes.shared_batch,
            shared,
        ),
        "throughput": throughput(sizes, work),
        "comm_bench": comm_bench(sizes, work, "cpu" if dry else "cuda"),
    }
    if not dry:
        result["model_inputs"] = model_inputs(work, "gpu", work / "comm_bench.json", [], FULL.timeout_s)
    result["seconds"] = time.perf_counter() - t0
    result["ok"] = (
        all(r["ok"] for p in ("nccl_one_rank", "gloo_shared_gpu") for r in result[p]["rows"].values())
        and all(r["ok"] for r in result["throughput"]["rows"].values())
        and result["comm_bench"]["ok"]
        and result.get("model_inputs", {"ok": True})["ok"]
    )
    path = out / f"check-{result['host']}-{stamp}{'-dry' if dry else ''}.json"
    path.write_text(json.dumps(result, indent=2))
    print(format_report(result))
    print(f"gpu-check: wrote {path} (run directories in {work})")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
