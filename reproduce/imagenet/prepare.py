"""ILSVRC-2012 (ImageNet-1k) from its official archives into the layout ``data=imagenet`` reads:
``OUT/train/<wnid>/*.JPEG`` and ``OUT/val/<wnid>/*.JPEG`` (torchvision's ImageFolder, one folder per class).

    python reproduce/imagenet/prepare.py SRC OUT

SRC holds the archives as image-net.org gives them (the labels may also be Kaggle's, from its "ImageNet Object
Localization Challenge"); nothing is downloaded:

- ``ILSVRC2012_img_train.tar``: one tar per class inside (``n01440764.tar`` ...), each holding that class's
  images;
- ``ILSVRC2012_img_val.tar``: the 50,000 validation images, flat (``ILSVRC2012_val_00000001.JPEG`` ...);
- the validation labels, either Kaggle's ``LOC_val_solution.csv`` (image id, then boxes that start with the
  wnid), or the devkit ``ILSVRC2012_devkit_t12.tar.gz`` (``data/ILSVRC2012_validation_ground_truth.txt``: one
  class index per image in image order, and ``data/meta.mat``: index -> wnid; read with scipy).

Each split is written into ``OUT/<split>.partial`` and renamed to ``OUT/<split>`` when it is complete (each
archive read to its end-of-archive blocks, every labelled validation image found), so a split that exists is
done: an interrupted preparation is run again and redoes only the split it was in. OUT, or a split in it, that
is a symbolic link is refused; a validation label that is not a WordNet id too (it names a folder).
Archive members are streamed (no inner tar lands on disk) and written under their base names only, regular
files only. At the end the folder is checked as ``wagma-bench sweep`` and ``run`` check ``data.root`` (when
wagma_bench is importable), and the counts are printed (the full set: 1,281,167 training and 50,000 validation
images in 1,000 classes).
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import re
import shutil
import sys
import tarfile
from pathlib import Path

TRAIN_TAR = "ILSVRC2012_img_train.tar"
VAL_TAR = "ILSVRC2012_img_val.tar"
KAGGLE_LABELS = "LOC_val_solution.csv"
DEVKIT = "ILSVRC2012_devkit_t12.tar.gz"
WNID = re.compile(r"n\d{8}")
FULL = {"train": (1000, 1_281_167), "val": (1000, 50_000)}  # classes, images of ILSVRC-2012
CHUNK = 1 << 20


def copy_member(archive: tarfile.TarFile, member: tarfile.TarInfo, folder: Path) -> bool:
    """Write a regular file of ``archive`` into ``folder`` under its base name; False for anything else."""
    name = os.path.basename(member.name)
    if not member.isfile() or not name or name.startswith("."):
        return False
    source = archive.extractfile(member)
    with source, open(folder / name, "wb") as out:
        shutil.copyfileobj(source, out, CHUNK)
    return True


def prepare_train(tar: Path, out: Path) -> None:
    """The training archive's per-class tars, each into ``train/<wnid>/``."""
    count = 0
    with tarfile.open(tar, "r|") as outer:  # streamed: 138 GB read once, in order
        for inner in outer:
            wnid = os.path.basename(inner.name).removesuffix(".tar")
            if not inner.isfile() or not WNID.fullmatch(wnid):
                continue
            folder = out / wnid
            folder.mkdir(parents=True, exist_ok=True)
            with tarfile.open(fileobj=outer.extractfile(inner), mode="r|") as images:
                count += sum(copy_member(images, m, folder) for m in images)
                # the outer tar's header gives the inner's size: its end-of-archive blocks must follow
                if images.offset + 2 * tarfile.BLOCKSIZE > inner.size:
                    raise SystemExit(f"prepare.py: {tar.name}: {inner.name} {CUT}")
            print(f"train/{wnid}: {sum(1 for _ in folder.iterdir())} images ({count:,} so far)", flush=True)
        ended = outer.offset
    check_ended(tar, ended)


CUT = "ends after a member without the end-of-archive blocks: it was cut short; copy it again"


def check_ended(tar: Path, offset: int) -> None:
    """A streamed tar that ends at a member boundary reads as complete (tarfile stops without an error); the
    end-of-archive blocks (two of zeros, where the next header would be) say it was written to its end."""
    with open(tar, "rb") as f:
        f.seek(offset)
        tail = f.read(2 * tarfile.BLOCKSIZE)
    if len(tail) < 2 * tarfile.BLOCKSIZE or tail.strip(b"\0"):
        raise SystemExit(f"prepare.py: {tar} {CUT}")


def kaggle_labels(path: Path) -> dict[str, str]:
    """Image id -> wnid from ``LOC_val_solution.csv`` (the wnid opens each box's prediction string)."""
    with open(path, newline="") as f:
        return {row["ImageId"]: row["PredictionString"].split()[0] for row in csv.DictReader(f)}


def devkit_labels(path: Path) -> dict[str, str]:
    """Image id -> wnid from the devkit: the ground-truth class indices in image order, mapped through
    meta.mat."""
    from scipy.io import loadmat

    with tarfile.open(path) as devkit:
        files = {os.path.basename(m.name): m for m in devkit.getmembers() if m.isfile()}
        truth = devkit.extractfile(files["ILSVRC2012_validation_ground_truth.txt"]).read().decode().split()
        meta = loadmat(io.BytesIO(devkit.extractfile(files["meta.mat"]).read()), squeeze_me=True)["synsets"]
    wnid = {int(s["ILSVRC2012_ID"]): str(s["WNID"]) for s in meta}
    return {f"ILSVRC2012_val_{i:08d}": wnid[int(label)] for i, label in enumerate(truth, 1)}


def prepare_val(tar: Path, labels: dict[str, str], out: Path) -> None:
    """The flat validation archive into ``val/<wnid>/`` by the labels, each a WordNet id (a folder name made
    from a CSV stays inside ``out``); every labelled image must be in the archive."""
    bad = next(((i, w) for i, w in labels.items() if not WNID.fullmatch(w)), None)
    if bad is not None:
        raise SystemExit(
            f"prepare.py: the label of {bad[0]} is {bad[1]!r}, not a WordNet id (n and 8 digits); "
            "are these ILSVRC-2012's validation labels?"
        )
    unlabelled, written = [], 0
    with tarfile.open(tar, "r|") as images:
        for member in images:
            image_id = os.path.basename(member.name).rsplit(".", 1)[0]
            if not member.isfile():
                continue
            if image_id not in labels:
                unlabelled.append(image_id)
                continue
            folder = out / labels[image_id]
            folder.mkdir(parents=True, exist_ok=True)
            written += copy_member(images, member, folder)
        ended = images.offset
    check_ended(tar, ended)
    if written < len(labels):
        raise SystemExit(
            f"prepare.py: {tar} holds {written:,} of the {len(labels):,} labelled validation images; "
            "are the archive and the labels of the same release?"
        )
    if unlabelled:
        raise SystemExit(
            f"prepare.py: {len(unlabelled)} validation images have no label (first: {unlabelled[0]}); "
            "are the archive and the labels of the same release?"
        )


def split_into(out: Path, split: str, write) -> None:
    """``write(folder)`` into ``OUT/<split>.partial``, then renamed to ``OUT/<split>``; an existing split is
    kept."""
    final, partial = out / split, out / f"{split}.partial"
    link = next((p for p in (final, partial) if p.is_symlink()), None)
    if link is not None:  # before "exists": a link to someone's folder is no finished split
        raise SystemExit(f"prepare.py: {link} is a symbolic link; refusing to read or write through it")
    if final.is_dir():
        print(f"{final} exists: kept (remove it to prepare it again)", flush=True)
        return
    shutil.rmtree(partial, ignore_errors=True)  # an interrupted attempt
    partial.mkdir(parents=True)
    write(partial)
    partial.rename(final)


def labels_from(src: Path):
    if (src / KAGGLE_LABELS).exists():
        return lambda: kaggle_labels(src / KAGGLE_LABELS)
    if (src / DEVKIT).exists():
        return lambda: devkit_labels(src / DEVKIT)
    raise SystemExit(
        f"prepare.py: no validation labels in {src}: give {KAGGLE_LABELS} (Kaggle) or {DEVKIT} (devkit)"
    )


def report(out: Path) -> None:
    for split, (classes_full, images_full) in FULL.items():
        classes = [d for d in (out / split).iterdir() if d.is_dir()]
        images = sum(1 for d in classes for _ in d.iterdir())
        full = (
            ""
            if (len(classes), images) == (classes_full, images_full)
            else (f" (the full set has {classes_full:,} classes, {images_full:,} images)")
        )
        print(f"{out / split}: {len(classes):,} classes, {images:,} images{full}")
    try:
        from wagma_bench.workloads.specs import check_imagenet_root
    except ImportError:
        return
    check_imagenet_root(str(out))
    print(f"data.root={out}: the layout data=imagenet reads (the check of wagma-bench sweep and run)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="prepare.py",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "src", type=Path, help=f"folder holding {TRAIN_TAR}, {VAL_TAR} and {KAGGLE_LABELS} or {DEVKIT}"
    )
    ap.add_argument("out", type=Path, help="the data.root to write: OUT/train/<wnid>/, OUT/val/<wnid>/")
    ns = ap.parse_args(argv)
    for name in (TRAIN_TAR, VAL_TAR):
        if not (ns.src / name).is_file():
            raise SystemExit(
                f"prepare.py: {ns.src / name} is missing (image-net.org's ILSVRC-2012 archives; nothing "
                "is downloaded here)"
            )
    labels = labels_from(ns.src)
    if ns.out.is_symlink():  # its splits would land in the link's target
        raise SystemExit(f"prepare.py: {ns.out} is a symbolic link; give the folder itself as OUT")
    ns.out.mkdir(parents=True, exist_ok=True)
    split_into(ns.out, "train", lambda folder: prepare_train(ns.src / TRAIN_TAR, folder))
    split_into(ns.out, "val", lambda folder: prepare_val(ns.src / VAL_TAR, labels(), folder))
    report(ns.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
