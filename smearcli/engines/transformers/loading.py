"""A local Hugging Face model directory, loaded without trusting it (part of `smearcli.engines.transformers`).

Everything transformers would read is checked first (`smearcli.engines.transformers.files`), so a bad
directory is one UserError naming the file and the problem, never transformers' own failure,
prompt or load report:

- **No code from the directory runs.** `trust_remote_code` is always False, and a config whose
  `model_type` transformers does not know and whose `auto_map` points at a `.py` file is refused
  before transformers is asked (so it never prompts "Do you wish to run the custom code?").
- **No pickle is read**: safetensors only, every shard checked.
- **Shapes** are compared with the model the config describes (built on the meta device, no
  memory), and that model must fit in memory (`preflight.check_memory`), before loading; after
  loading, transformers' own loading info must list no missing (randomly initialised),
  unexpected or mismatched key.
- **Quiet**: its load report, progress bars and warnings are silenced while it loads, and
  anything it prints goes to stderr, never stdout (which carries --json).
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from pathlib import Path
from typing import Optional

import torch

from ...gpt.checkpoint import one_line_reason
from ...util.errors import UserError
from ...util.preflight import check_memory
from .files import CONFIG, GENERATION, check_config, check_weights, listed, read_json, weight_files


def require_transformers():
    try:
        import transformers
    except ImportError:
        raise UserError("Hugging Face models need the optional dependency transformers: "
                        "pip install 'smearcli[hf]'") from None
    return transformers


# -- transformers -----------------------------------------------------------------------------------
@contextlib.contextmanager
def quiet(tf):
    """transformers with its load report, progress bars and warnings off, and anything it prints
    on stdout sent to stderr (stdout carries --json)."""
    log = tf.utils.logging
    verbosity, bars = log.get_verbosity(), log.is_progress_bar_enabled()
    log.set_verbosity_error()
    log.disable_progress_bar()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(sys.stderr):
            warnings.simplefilter("ignore")
            yield
    finally:
        log.set_verbosity(verbosity)
        if bars:
            log.enable_progress_bar()


def _theirs(e: Exception) -> str:
    return f"{type(e).__name__}: {one_line_reason(e)}"


def config_and_skeleton(tf, path: Path):
    """The checked config and the model it describes, built on the meta device (no memory)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    raw = read_json(path / CONFIG, str(path / CONFIG))
    notes = check_config(raw, str(path / CONFIG), CONFIG_MAPPING)
    if (path / GENERATION).exists():
        read_json(path / GENERATION, str(path / GENERATION))
    if (path / "adapter_config.json").exists():
        raise UserError(f"{path} holds adapter_config.json (a PEFT adapter); give the full model's directory")
    try:
        cfg = tf.AutoConfig.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    except MemoryError:
        raise
    except Exception as e:  # noqa: BLE001 - transformers refusing the user's file
        raise UserError(f"{path / CONFIG}: transformers cannot read it ({_theirs(e)})") from None
    try:
        with torch.device("meta"):
            skeleton = tf.AutoModelForCausalLM.from_config(cfg, trust_remote_code=False)
    except MemoryError:
        raise
    except Exception as e:  # noqa: BLE001
        raise UserError(f"{path / CONFIG}: transformers cannot build a causal LM from it ({_theirs(e)})") from None
    return cfg, skeleton, notes


def check_shapes(skeleton, found: dict[str, tuple[str, tuple, int]], dtype: Optional[torch.dtype]) -> None:
    """Every saved tensor the model has under the same name has the model's shape, and the model
    fits in memory (a config can describe far more layers than its weights hold)."""
    state = skeleton.state_dict()
    for k, (file, shape, _) in sorted(found.items()):
        if k in state and tuple(state[k].shape) != shape:
            raise UserError(f"{file}: {k} has shape {shape}, {type(skeleton).__name__} from {CONFIG} "
                            f"expects {tuple(state[k].shape)}")
    n = sum(t.numel() for t in (*skeleton.parameters(), *skeleton.buffers()))  # a tied tensor once
    itemsize = dtype.itemsize if dtype is not None else max((b for _, _, b in found.values()), default=4)
    check_memory(n * itemsize, "cpu", f"{CONFIG}'s {type(skeleton).__name__} ({n:,} parameters)",
                 "free memory, or check that config.json describes these weights")


def check_loading_info(path: Path, cls: str, info: dict) -> None:
    """transformers' own account of the load: nothing initialised at random, nothing left over."""
    if info.get("missing_keys"):
        keys = info["missing_keys"]
        raise UserError(f"{path}: the weights lack {len(keys)} tensor(s) {cls} needs ({listed(keys)}); "
                        "transformers would initialise them at random")
    if info.get("unexpected_keys"):
        keys = info["unexpected_keys"]
        raise UserError(f"{path}: the weights hold {len(keys)} tensor(s) {cls} does not have ({listed(keys)}); "
                        f"does {CONFIG} describe these weights?")
    if info.get("mismatched_keys"):
        keys = [k[0] if isinstance(k, tuple) else k for k in info["mismatched_keys"]]
        raise UserError(f"{path}: {len(keys)} tensor(s) of the wrong shape for {cls} ({listed(keys)})")
    if info.get("error_msgs"):
        raise UserError(f"{path}: transformers reports {one_line_reason(Exception(info['error_msgs'][0]))}")


def load_dir_with_notes(path, dtype: Optional[torch.dtype] = None):
    """(model in eval mode, notes) for a local model directory: every check above, then
    transformers offline, safetensors only, trust_remote_code off."""
    tf = require_transformers()
    path = Path(path)
    if not path.is_dir():
        raise UserError(f"{path} is not a directory")
    if not (path / CONFIG).exists() and not (path / CONFIG).is_symlink():
        raise UserError(f"{path} has no {CONFIG}: not a Hugging Face model directory")
    files, wmap = weight_files(path)  # before the config: a pickled directory says so first
    with quiet(tf):
        cfg, skeleton, notes = config_and_skeleton(tf, path)
        found = check_weights(files, wmap)
        check_shapes(skeleton, found, dtype)
        try:
            model, info = tf.AutoModelForCausalLM.from_pretrained(
                str(path), config=cfg, local_files_only=True, use_safetensors=True, trust_remote_code=False,
                output_loading_info=True, **({} if dtype is None else {"dtype": dtype}))
        except MemoryError:
            raise
        except Exception as e:  # noqa: BLE001 - their directory, checked above, still refused by transformers
            raise UserError(f"{path}: transformers cannot load the model ({_theirs(e)})") from None
    check_loading_info(path, type(model).__name__, info)
    return model.eval(), notes


