"""Finding the files to shard: an ImageFolder tree (``class/xxx.jpg``) or a file list, with labels.

Classes of an ImageFolder tree are numbered as ``torchvision.datasets.ImageFolder`` numbers them
(sorted directory names), unless a class map says otherwise; a file list gives each file's label
itself. Files are listed in a deterministic order.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from dali_shards.errors import ConfigError
from dali_shards.io.filesystems import DEFAULT_STORAGE, filesystem, is_remote
from dali_shards.options import StorageOptions

log = logging.getLogger("dali_shards")
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


class SourceFile(NamedTuple):
    """A file to put into a shard: its path (or URL), its label (or None), its member extension,
    its size where known, and other members of its sample (extension, value), e.g. from Parquet."""

    path: str
    label: Optional[int]
    ext: str
    size: Optional[int] = None
    extra: Tuple[Tuple[str, Any], ...] = ()


# Member extensions the writer normalises: ImageNet's ``.JPEG`` and every other spelling of JPEG
# become ``.jpg``, as WebDataset's writers and DALI's examples name them, and ``.tif`` ``.tiff``.
CANONICAL_EXTENSIONS = {"jpeg": "jpg", "jpe": "jpg", "jfif": "jpg", "tif": "tiff"}


def _extension(path: str) -> str:
    """The member extension of a file: lower-cased, JPEG spellings as ``jpg``."""
    ext = os.path.splitext(path)[1].lstrip(".").lower()
    return CANONICAL_EXTENSIONS.get(ext, ext)


def find_image_folder(
    root: str, class_map: Optional[Dict[str, int]] = None, numeric: bool = False
) -> Tuple[List[SourceFile], Dict[str, int]]:
    """The images under ``root/<class>/...`` with their class index, and the class map used;
    ``numeric`` takes integer directory names (e.g. ImageNet class ids) as the labels."""
    if not os.path.isdir(root):
        raise ConfigError(f"{root!r} is not a directory; give an ImageFolder tree (class/xxx.jpg) or a file list")
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    class_map = class_map_of(root, classes, class_map, numeric)
    files = []
    hidden = []
    for name in classes:
        for folder, dirs, names in sorted(os.walk(os.path.join(root, name), followlinks=True)):
            dirs.sort()
            for fname in sorted(names):
                if fname.lower().endswith(IMAGE_EXTENSIONS):
                    path = os.path.join(folder, fname)
                    if is_hidden(path):
                        hidden.append(path)
                    else:
                        files.append(SourceFile(path, class_map[name], _extension(path)))
    warn_hidden(hidden)
    if not files:
        raise ConfigError(f"no images ({', '.join(IMAGE_EXTENSIONS)}) under {root!r}")
    return files, class_map


def class_map_of(root: str, classes: List[str], class_map: Optional[Dict[str, int]], numeric: bool) -> Dict[str, int]:
    """The class map of a tree with class folders ``classes`` (sorted): given, numeric, or numbered
    in order as torchvision numbers them."""
    if not classes:
        raise ConfigError(f"{root!r} has no class subdirectories (expected {root}/<class>/<image>)")
    if numeric:
        bad = [c for c in classes if not c.isdigit()]
        if bad:
            raise ConfigError(f"numeric class directories expected, got {bad[:5]}; drop --numeric-classes")
        return {name: int(name) for name in classes}
    if class_map is None:
        return {name: i for i, name in enumerate(classes)}
    unknown = [c for c in classes if c not in class_map]
    if unknown:
        raise ConfigError(f"classes {unknown[:5]} of {root!r} are not in the class map; add them or drop them")
    return class_map


def read_file_list(path: str) -> List[SourceFile]:
    """Files from a list: one ``path [label]`` per line (``#`` comments and blank lines ignored);
    relative paths are relative to the list's directory."""
    base = os.path.dirname(os.path.abspath(path))
    files = []
    try:
        lines = open(path, encoding="utf-8").read().splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read file list {path!r}: {exc}") from None
    labelled: Optional[Tuple[int, bool]] = None  # (line number, labelled?) of the first entry
    hidden: List[str] = []
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        line, label = _split_label(line)
        if labelled is None:
            labelled = (number, label is not None)
        elif labelled[1] != (label is not None):
            has, lacks = ("has", "lacks") if labelled[1] else ("lacks", "has")
            raise ConfigError(
                f"{path}:{number}: this line {lacks} a label but line {labelled[0]} {has} one; "
                "give every file a label, or none"
            )
        file_path = line if os.path.isabs(line) or "://" in line else os.path.join(base, line)
        if "://" not in file_path and not os.path.isfile(file_path):
            where = "" if os.path.isabs(line) else f" (relative paths are taken from the list's folder: {file_path})"
            raise ConfigError(f"{path}:{number}: file {line!r} not found{where}")
        if is_hidden(file_path):
            hidden.append(f"{path}:{number} ({line})")
            continue
        ext = _extension(file_path)
        if not ext:
            raise ConfigError(f"{path}:{number}: {line!r} has no extension to name its member by")
        files.append(SourceFile(file_path, label, ext))
    warn_hidden(hidden)
    if not files:
        raise ConfigError(f"file list {path!r} names no files")
    return files


def is_hidden(path: str) -> bool:
    """True for a hidden file (its name starts with a dot: ``.jpg``, macOS's ``._x.jpg``), which is
    not a sample: such a name has no key, or not the file's own."""
    return os.path.basename(path).startswith(".")


def warn_hidden(skipped: List[str]) -> None:
    """One warning counting the hidden files left out, with a few of them."""
    if skipped:
        log.warning("dali_shards: skipped %d hidden files (names starting with '.'), not samples: %s%s",
                    len(skipped), ", ".join(skipped[:3]), " ..." if len(skipped) > 3 else "")  # fmt: skip


def _split_label(line: str) -> Tuple[str, Optional[int]]:
    """``path [label]``: the path and the integer label, if the last word is one."""
    parts = line.rsplit(None, 1)
    if len(parts) == 2:
        try:
            return parts[0], int(parts[1])
        except ValueError:
            pass
    return line, None


def find_sources(
    src: str, class_map: Optional[Dict[str, int]] = None, numeric: bool = False
) -> Tuple[List[SourceFile], Optional[Dict[str, int]]]:
    """The files of an ImageFolder tree or a file list, and the class map (None for a list)."""
    if os.path.isdir(src):
        return find_image_folder(src, class_map, numeric)
    if not os.path.exists(src):
        raise ConfigError(f"{src!r} does not exist: give an ImageFolder root (class/xxx.jpg) or a file list")
    return read_file_list(src), None


def load_class_map(path: str) -> Dict[str, int]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read class map {path!r}: {exc}") from None
    if not isinstance(data, dict) or not all(isinstance(v, int) for v in data.values()):
        raise ConfigError(f"class map {path!r} must be a JSON object of class name -> integer index")
    return data


def save_class_map(path: str, class_map: Dict[str, int], storage: StorageOptions = DEFAULT_STORAGE) -> None:
    """Write ``classes.json`` (a local path or a URL): class name -> index, by index."""
    text = json.dumps(dict(sorted(class_map.items(), key=lambda kv: kv[1])), indent=1) + "\n"
    if is_remote(path):
        fs, inner = filesystem(path, storage)
        fs.pipe_file(inner, text.encode("utf-8"))
        return
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def stem_keys(files: List[SourceFile]) -> Tuple[List[str], List[Tuple[str, str]]]:
    """Each file's key: its name without the extension (``n01440764_10026``), as WebDataset's
    ImageNet shards key their samples. Dots left in a stem become ``_`` (a member's first dot
    starts its extension); a stem already taken by an earlier file (in another folder) gets
    ``_2``, ``_3``... Returns the keys, in the files' order, and (path, key) of every renamed file."""
    keys: List[str] = []
    renamed: List[Tuple[str, str]] = []
    taken: Dict[str, int] = {}
    stems = [os.path.splitext(os.path.basename(f.path))[0].replace(".", "_") or "_" for f in files]
    used = set(stems)
    for f, stem in zip(files, stems):
        key = stem
        if key in taken:
            n = taken[stem]
            while f"{stem}_{n}" in used:
                n += 1
            taken[stem] = n + 1
            key = f"{stem}_{n}"
            used.add(key)
        else:
            taken[stem] = 2
        if key != os.path.splitext(os.path.basename(f.path))[0]:
            renamed.append((f.path, key))
        keys.append(key)
    return keys, renamed
