"""Find a nanochat checkpoint the way nanochat's own scripts do.

nanochat keeps everything under a base directory, `$NANOCHAT_BASE_DIR` (default
`~/.cache/nanochat`):

```text
<base>/tokenizer/tokenizer.pkl
<base>/base_checkpoints/d20/model_021400.pt + meta_021400.json   (source "base")
<base>/chatsft_checkpoints/d20/...                               (source "sft")
<base>/chatrl_checkpoints/d20/...                                (source "rl")
```

`discover` accepts any level of that tree (the base, a `*_checkpoints` directory, or a leaf
directory holding the model/meta pairs, which is also the flat layout of published checkpoints)
and picks, as nanochat does, the largest `dN` model tag and the newest step unless told which.
Nothing is loaded or unpickled here.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..util.errors import UserError
from ..util.files import regular_file
from .checkpoint import find_step, list_steps
from .tokenizer import find_tokenizer

# nanochat's checkpoint_manager: source -> folder under the base directory ("mid" is from older
# nanochat versions, which had a midtraining stage)
SOURCE_DIRS = {"base": "base_checkpoints", "sft": "chatsft_checkpoints", "rl": "chatrl_checkpoints",
               "mid": "mid_checkpoints"}
DEFAULT_SOURCE_ORDER = ("sft", "rl", "base", "mid")  # tried in this order when none is given
_DIR_SOURCES = {v: k for k, v in SOURCE_DIRS.items()}
_TAG_DEPTH = re.compile(r"d(\d+)")  # nanochat matches this at the start of the tag name


@dataclass(frozen=True)
class Discovered:
    """A checkpoint found on disk: load it with `weights.load_checkpoint(found.leaf, found.step)`."""
    leaf: Path  # the directory holding model_XXXXXX.pt / meta_XXXXXX.json
    step: int
    source: Optional[str]  # "base", "sft", "rl" ("mid"), or None for a flat directory
    tag: Optional[str]  # the model tag (the leaf's name) when it sits in a *_checkpoints directory
    base_dir: Optional[Path]  # the nanochat base directory, when the leaf sits in one
    tokenizer: Optional[Path]  # tokenizer.pkl if one was found (never read here)

    @property
    def description(self) -> str:
        """One line to print, e.g. "base_checkpoints/d20 step 21400"."""
        where = f"{self.leaf.parent.name}/{self.leaf.name}" if self.tag else str(self.leaf)
        return f"{where} step {self.step}"


def default_base_dir() -> Path:
    """nanochat's base directory: $NANOCHAT_BASE_DIR, else ~/.cache/nanochat (not created)."""
    env = os.environ.get("NANOCHAT_BASE_DIR")
    return Path(os.path.expanduser(env)) if env else Path.home() / ".cache" / "nanochat"


def _steps(d: Path) -> list[int]:
    try:
        return list_steps(d)
    except OSError as e:
        raise UserError(f"{d}: cannot list the directory ({e.strerror or e})") from e


def _subdirs(d: Path) -> list[Path]:
    try:
        return sorted(p for p in d.iterdir() if p.is_dir())
    except OSError as e:
        raise UserError(f"{d}: cannot list the directory ({e.strerror or e})") from e


def _shown(names: list[str], limit: int = 6) -> str:
    if not names:
        return "nothing"
    return ", ".join(names[:limit]) + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def pick_model_tag(checkpoints_dir: Path) -> str:
    """nanochat's rule for a missing model tag: the tag `d<N>` with the largest N (the name only has
    to start with d and digits, as upstream's re.match); when no tag has that form, the most
    recently modified one. Unlike upstream, tag folders without a model/meta pair are skipped, and
    equal depths are broken by name (upstream keeps the directory's listing order)."""
    tags = [p for p in _subdirs(checkpoints_dir) if _steps(p)]
    if not tags:
        found = [p.name for p in _subdirs(checkpoints_dir)]
        detail = (f"its folders ({_shown(found)}) hold no model_XXXXXX.pt / meta_XXXXXX.json pair"
                  if found else "it has no model tag folders (d12, d20, ...)")
        raise UserError(f"{checkpoints_dir}: no checkpoints: {detail}")
    by_depth = [(int(m.group(1)), p.name) for p in tags if (m := _TAG_DEPTH.match(p.name))]
    if by_depth:
        return max(by_depth, key=lambda t: (t[0], t[1]))[1]
    return max(tags, key=lambda p: (p.stat().st_mtime, p.name)).name


def _check_source(source: Optional[str]) -> None:
    if source is not None and source not in SOURCE_DIRS:
        raise UserError(f"unknown checkpoint source {source!r}; choose base, sft or rl")


def discover(path=None, source: Optional[str] = None, model_tag: Optional[str] = None,
             step: Optional[int] = None) -> Discovered:
    """Find the checkpoint to load, as nanochat's load_model(source, model_tag=, step=) does.

    `path` may be:
    - a leaf directory with model/meta pairs (a published checkpoint, or `<base>/<src>_checkpoints/dN`);
    - a `*_checkpoints` directory (base_checkpoints, chatsft_checkpoints, chatrl_checkpoints);
    - a base directory containing those; None means $NANOCHAT_BASE_DIR (default ~/.cache/nanochat).
    `source` ("base", "sft", "rl") picks the `*_checkpoints` folder of a base directory; when None,
    the first present of sft, rl, base is used. `model_tag` (e.g. "d20") picks the tag folder; when
    None, the largest dN (see `pick_model_tag`). `step` picks the step; when None, the newest.
    A source or tag that contradicts the path given is an error. Raises UserError saying what was
    looked for and what was found."""
    _check_source(source)
    if model_tag is not None and (not model_tag or "/" in model_tag or "\\" in model_tag or model_tag in (".", "..")):
        raise UserError(f"model tag {model_tag!r} is not a folder name (expected e.g. d20)")
    if path is None:
        root = default_base_dir()
        if not root.is_dir():
            raise UserError(f"no nanochat base directory at {root} (set NANOCHAT_BASE_DIR, or give the "
                            "checkpoint directory)")
    else:
        root = Path(os.path.expanduser(str(path)))
        if root.is_file():
            raise UserError(f"{root}: a file, not a directory; give the directory that holds the "
                            "model_XXXXXX.pt / meta_XXXXXX.json pair, or a nanochat base directory")
        if root.is_symlink() and not root.exists():  # dangling, or a loop: say which
            regular_file(root)
        if not root.is_dir():
            raise UserError(f"{root}: directory not found")

    # 1) a leaf: the pairs are right here
    if _steps(root):
        parent_source = _DIR_SOURCES.get(root.parent.name)
        if source is not None and parent_source is not None and source != parent_source:
            raise UserError(f"{root} is a {parent_source} checkpoint ({root.parent.name}), not {source}")
        if model_tag is not None and model_tag != root.name:
            raise UserError(f"{root} is itself a checkpoint directory ({root.name}); model tag "
                            f"{model_tag} does not apply to it")
        nested = parent_source is not None
        base = root.parent.parent if nested else None
        return Discovered(root, find_step(root, step)[1], parent_source, root.name if nested else None,
                          base, find_tokenizer(root, base))

    # 2) a *_checkpoints directory, or 3) a base directory holding some
    if root.name in _DIR_SOURCES or (root.name.endswith("_checkpoints") and not _has_source_dirs(root)):
        dir_source = _DIR_SOURCES.get(root.name)
        if source is not None and dir_source is not None and source != dir_source:
            raise UserError(f"{root} holds {dir_source} checkpoints, not {source}")
        checkpoints_dir, base, found_source = root, root.parent, dir_source
    else:
        base = root
        if source is not None:
            checkpoints_dir = root / SOURCE_DIRS[source]
            if not checkpoints_dir.is_dir():
                raise UserError(f"{root}: no {SOURCE_DIRS[source]} folder for {source} checkpoints "
                                f"({_found_here(root)})")
            found_source = source
        else:
            present = [s for s in DEFAULT_SOURCE_ORDER if (root / SOURCE_DIRS[s]).is_dir()]
            if not present:
                raise UserError(f"{root}: not a checkpoint directory: no model_XXXXXX.pt / meta_XXXXXX.json "
                                f"pair and no base_checkpoints, chatsft_checkpoints or chatrl_checkpoints "
                                f"folder ({_found_here(root)})")
            found_source = present[0]
            checkpoints_dir = root / SOURCE_DIRS[found_source]
    if model_tag is None:
        model_tag = pick_model_tag(checkpoints_dir)
    leaf = checkpoints_dir / model_tag
    if not leaf.is_dir():
        tags = [p.name for p in _subdirs(checkpoints_dir)]
        raise UserError(f"{checkpoints_dir}: no model tag {model_tag} (found {_shown(tags)})")
    return Discovered(leaf, find_step(leaf, step)[1], found_source, model_tag, base,
                      find_tokenizer(leaf, base))


def _has_source_dirs(d: Path) -> bool:
    return any((d / name).is_dir() for name in SOURCE_DIRS.values())


def _found_here(d: Path) -> str:
    try:
        names = sorted(p.name + ("/" if p.is_dir() else "") for p in d.iterdir())
    except OSError as e:
        return f"cannot list it: {e.strerror or e}"
    return "found " + _shown(names)
