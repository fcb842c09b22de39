"""The settings ConfigMap → ``SettingsChanged`` (DESIGN §12). Pure.

Data keys are named like the ``SettingsChanged`` fields; booleans are ``"true"``/``"false"``
(any case), the rest decimal numbers. A change appends one ``SettingsChanged`` with the keys
whose value changed; a key removed from the ConfigMap returns to its DESIGN §4 default
(DECISIONS 102); a bad value or an unknown key is a rejection naming the key, and the other
keys still apply.
"""

from __future__ import annotations

from typing import Any

from quotaledger.projections.state import Settings

BOOL_KEYS = ("min_scaling", "revoke_enabled", "reclaim_enabled", "quota_preemption_enabled")
NUMBER_KEYS = ("revoke_after_s", "reclaim_after_s", "preemption_miss_percent")
DEFAULTS: dict[str, Any] = {key: getattr(Settings(), key) for key in BOOL_KEYS + NUMBER_KEYS}


def current(settings: Settings) -> dict[str, Any]:
    """The settings in force as a plain dict (the baseline after a restart)."""
    return {key: getattr(settings, key) for key in DEFAULTS}


def _value(key: str, text: Any) -> Any:
    if not isinstance(text, str):
        raise ValueError("expected a string")
    if key in BOOL_KEYS:
        lowered = text.strip().lower()
        if lowered not in ("true", "false"):
            raise ValueError(f'{text!r} is not "true" or "false"')
        return lowered == "true"
    try:
        number = float(text.strip())
    except ValueError:
        raise ValueError(f"{text!r} is not a number") from None
    if number != number or number < 0:
        raise ValueError(f"{text!r} must be a number >= 0")
    if key == "preemption_miss_percent" and number > 100:
        raise ValueError(f"{text!r} must be at most 100")
    if key != "preemption_miss_percent" and number > 315_360_000:
        raise ValueError(f"{text!r} is more than 315360000 s (DESIGN §9)")
    return number


def settings_change(
    data: dict[str, Any] | None, last: dict[str, Any]
) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """(the changed keys and their new values, [(key, reason)] for bad keys).

    ``last`` is what the ledger holds now; a key with a bad value keeps its value."""
    data = data or {}
    changed: dict[str, Any] = {}
    bad: list[tuple[str, str]] = []
    for key in sorted(data):
        if key not in DEFAULTS:
            bad.append((key, "not a setting (DESIGN §4 SettingsChanged)"))
    for key, default in DEFAULTS.items():
        if key in data:
            try:
                value = _value(key, data[key])
            except ValueError as exc:
                bad.append((key, str(exc)))
                continue
        else:
            value = default
        if value != last.get(key, default):
            changed[key] = value
    return changed, bad
