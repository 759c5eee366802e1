"""The inputs reconstruction trusts only after checking: the contract's ids.

Special ids come from contract.json alone (the contract stage resolved them by name), and are
re-checked here against the loaded tokenizer: an id whose bytes are not its name (the
seed run's `<|im_end|>` -> "chas" bug) stops the stage before a single row is written.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class InputError(ValueError):
    """An input the stage cannot trust or find: contract.json, a table."""


def special_ids(path: Path, template: Any, tok: Any) -> dict[str, int]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        ids = data["special_ids"]
    except FileNotFoundError:
        raise InputError(f"{path}: not found; run the contract stage first (dvc repro contract)") from None
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise InputError(f"{path}: no 'special_ids' mapping ({e}); rerun the contract stage") from None
    if not isinstance(ids, dict) or not all(isinstance(v, int) and not isinstance(v, bool)
                                            for v in ids.values()):
        raise InputError(f"{path}: special_ids must map names to integer ids; rerun the contract stage")
    missing = sorted(set(template.special_names) - set(ids))
    if missing:
        raise InputError(
            f"{path}: special_ids lacks {', '.join(missing)}, which template {template.name} emits; "
            "rerun the contract stage with the same template params")
    problems = []
    for name in sorted(template.special_names):
        i = ids[name]
        if not 0 <= i < tok.vocab_size:
            problems.append(f"{name} -> {i} is outside the vocabulary (size {tok.vocab_size})")
        elif tok.token_bytes(i) != name.encode("utf-8"):
            problems.append(f"{name} -> {i}, which is the token {tok.token_bytes(i)!r}")
    if problems:
        raise InputError(
            f"{path}: {'; '.join(problems)}. The contract does not match tokenizer {tok.name}: "
            "rerun the contract stage (and fix tokenizer.expected_ids if it set these ids)")
    return {name: ids[name] for name in template.special_names}
