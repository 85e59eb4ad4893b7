"""The job kinds of the queue benchmark's mixes (make_mixes.py), and how each one is run.

A kind is one program with one set of arguments, so every job of a kind is the same job to
memgov's profiles (docs/profiles.md: a job is named from its script and arguments; a seed or an
output folder does not change it): the first run of a kind learns its peak, later runs claim it.

Small kinds are the PyTorch examples' unchanged mnist, vae and dcgan (github.com/pytorch/examples,
fetched, never copied into memgov: on the GPU machine they are under .public/examples) and this
repository's plain loop. Big kinds, 8-30 GiB each: GPT-2 from its config (transformers),
torchvision's ResNet-50 on synthetic images (resnet_synthetic.py), the examples' DCGAN with wide
networks and batches of 1,000 fake images.

``solo_s`` (the whole process alone: interpreter, imports, CUDA start-up, training) and
``peak_mib`` (NVML's peak for the process, its CUDA context included, as memgov's profiles count
it) come from size_kinds.py on an H200 (results/h200/2026-11-24-queue-sizing.txt). Every program
there spent 7.5-14 s before its first step (imports and CUDA start-up; transformers' import is the
slowest), so the kinds train for a few seconds only, to keep 30 jobs one at a time near 5 minutes.
Where the arguments here differ from the measured ones, ``sized`` says how the figures follow
from the measurement; make_mixes.py --measured replaces them with a later run's figures.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Kind:
    name: str
    family: str  # what the program is: mixes want every big family at least once
    where: str  # "examples" (a PyTorch examples script) or "repo" (a path in this repository)
    script: str
    args: tuple[str, ...]
    tiny_args: tuple[str, ...]  # the same program on the CPU in seconds (smoke runs)
    seed_option: str  # the script's seed option: a volatile argument, one value per job
    solo_s: float
    peak_mib: int
    sized: str  # where solo_s and peak_mib come from
    big: bool = False
    mnist_data: bool = False  # reads ../data/MNIST/raw (torchvision's MNIST, offline)

    def script_path(self, examples: Path) -> Path:
        return (examples if self.where == "examples" else ROOT) / self.script


_GPT2 = "benchmarks/gpu/gpt2_from_config.py"
_RESNET = "benchmarks/queue/resnet_synthetic.py"
_PLAIN = "benchmarks/workloads/plain_torch_mnist.py"
_FAKE = ("--dataset", "fake", "--accel", "--workers", "2", "--outf", ".")
_FAKE_TINY = ("--dataset", "fake", "--dry-run", "--workers", "0", "--batchSize", "8", "--outf", ".")
_QUIET = ("--log-interval", "100000")
_GPT2_TINY = ("--tiny", "--device", "cpu", "--batch", "2", "--seq", "32", "--steps", "2")

KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        # Small: about 1 GiB each, all start-up and CPU (DataLoader workers, PNG writes).
        Kind(
            "mnist",
            "mnist",
            "examples",
            "mnist/main.py",
            ("--epochs", "1", "--dry-run", *_QUIET),
            ("--epochs", "1", "--dry-run", "--no-accel", *_QUIET),
            "--seed",
            solo_s=10.0,
            peak_mib=1394,
            sized="measured a whole epoch (18.3 s, first step at 8.2 s); --dry-run trains one "
            "batch and tests on all 10,000 images",
            mnist_data=True,
        ),
        Kind(
            "vae",
            "vae",
            "examples",
            "vae/main.py",
            ("--epochs", "1", "--batch-size", "512", *_QUIET),
            ("--epochs", "1", "--no-accel", "--batch-size", "1024", *_QUIET),
            "--seed",
            solo_s=12.0,
            peak_mib=832,
            sized="measured at batch 128 (14.3 s, the epoch 4 s); batch 512 estimated",
            mnist_data=True,
        ),
        Kind(
            "dcgan",
            "dcgan",
            "examples",
            "dcgan/main.py",
            (*_FAKE, "--niter", "1"),
            _FAKE_TINY,
            "--manualSeed",
            solo_s=11.0,
            peak_mib=3338,
            sized="measured 4 epochs (19.3 s, 2.8 s each after 7.5 s of start-up); peak: torch's "
            "2,681 MiB + context (NVML's 50 ms samples missed cuDNN's benchmark; 3,338 MiB in "
            "results/h200/2026-11-24-auto-checks.json.gz)",
        ),
        Kind(
            "plain",
            "plain",
            "repo",
            _PLAIN,
            ("--epochs", "1", "--steps", "500", "--device", "gpu"),
            ("--epochs", "1", "--steps", "20", "--device", "cpu"),
            "--seed",
            solo_s=10.0,
            peak_mib=884,
            sized="measured 6 epochs (16.7 s, the first ending at 9.7 s)",
        ),
        # Big: 10-26 GiB each (NVML).
        Kind(
            "gpt2-b8s1024",
            "transformer",
            "repo",
            _GPT2,
            ("--batch", "8", "--seq", "1024", "--steps", "6"),
            _GPT2_TINY,
            "--seed",
            solo_s=15.0,
            peak_mib=16496,
            sized="measured 20 steps (19.4 s, 0.2 s a step after 14.5 s of start-up)",
            big=True,
        ),
        Kind(
            "gpt2-b12s1024",
            "transformer",
            "repo",
            _GPT2,
            ("--batch", "12", "--seq", "1024", "--steps", "5"),
            _GPT2_TINY,
            "--seed",
            solo_s=15.0,
            peak_mib=24078,
            sized="between the measured batches 8 (16,496 MiB) and 16 (31,660 MiB, 18.5 s for 12 "
            "steps)",
            big=True,
        ),
        Kind(
            "resnet50-b96",
            "resnet",
            "repo",
            _RESNET,
            ("--batch", "96", "--steps", "20"),
            ("--tiny", "--steps", "2"),
            "--seed",
            solo_s=12.0,
            peak_mib=10646,
            sized="measured 40 steps (15.3 s, the first program of its kind: 12.7 s of start-up)",
            big=True,
        ),
        Kind(
            "resnet50-b256",
            "resnet",
            "repo",
            _RESNET,
            ("--batch", "256", "--steps", "10"),
            ("--tiny", "--steps", "3"),
            "--seed",
            solo_s=10.5,
            peak_mib=26532,
            sized="measured 20 steps (11.9 s, 0.14 s a step after 9.1 s of start-up)",
            big=True,
        ),
        Kind(
            "gan-ngf128",
            "gan",
            "examples",
            "dcgan/main.py",
            (*_FAKE, "--niter", "1", "--batchSize", "1000", "--ngf", "128", "--ndf", "128"),
            (*_FAKE_TINY, "--ngf", "16", "--ndf", "16"),
            "--manualSeed",
            solo_s=14.0,
            peak_mib=20000,
            sized="estimated from the measured widths 192 (42,292 MiB, 33.5 s for 4 epochs) and "
            "256 (65,040 MiB at its first step): cuDNN's benchmark takes workspace while memory "
            "is free, so the peak shrinks under a cap",
            big=True,
        ),
    )
}

SMALL = tuple(k for k, v in KINDS.items() if not v.big)
BIG = tuple(k for k, v in KINDS.items() if v.big)
BIG_FAMILIES = tuple(sorted({KINDS[k].family for k in BIG}))
