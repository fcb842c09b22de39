"""Human-readable views of the state JSON: the quota tree in human units (DESIGN §7 ``tree``)."""

from __future__ import annotations

from typing import Any

from quotaledger.events.quantity import format_amount

COLUMNS = ("min", "max", "request", "used", "runtime")


def amounts(rl: dict[str, int] | None, *, unlimited: str = "-") -> str:
    """``4.5 cpu, 12Gi, 2 nvidia.com/gpu``; a null list is ``unlimited``."""
    if rl is None:
        return unlimited
    if not rl:
        return "-"
    parts = []
    for key in sorted(rl):
        text = format_amount(key, rl[key])
        parts.append(text if key in ("cpu", "memory") else f"{text} {key}")
    return ", ".join(parts)


def _line(name: str, quota: dict[str, Any]) -> str:
    tags = []
    if quota["is_parent"]:
        tags.append("parent")
    if quota["orphan"]:
        tags.append("orphan")
    label = name + (f" [{', '.join(tags)}]" if tags else "")
    cells = [f"{column} {amounts(quota[column], unlimited='unlimited')}" for column in COLUMNS]
    return f"{label}  " + "  ".join(cells)


def tree_text(state: dict[str, Any]) -> str:
    """``replay``'s view: a header (offset, time, hash, cluster totals), the quota tree
    (:func:`tree_lines`), then the running preemptions and the count of rejected records."""
    cluster = state["cluster"]
    lines = [
        f"offset {state['offset']} at {state['time']}  hash {state['hash'][:16]}",
        f"cluster total {amounts(cluster['total'])}"
        f"  (allocatable {amounts(cluster['allocatable'])};"
        f" system used {amounts(cluster['system_used'])};"
        f" default used {amounts(cluster['default_used'])})",
        *tree_lines(state),
    ]
    running = {q: p for q, p in state["preemptions"].items() if p["running"] or p["deadline"]}
    for queue, info in sorted(running.items()):
        lines.append(f"preemption {queue}: deadline {info['deadline']} running {info['running']}")
    if state["rejected"]:
        lines.append(f"{len(state['rejected'])} rejected record(s); see `replay --json`")
    return "\n".join(lines)


def tree_lines(state: dict[str, Any]) -> list[str]:
    """``tree``'s view (DECISIONS 263): ``root`` and every quota indented under its
    parent with min/max/request/used/runtime, then the orphans; nothing else."""
    quotas: dict[str, dict[str, Any]] = state["quotas"]
    lines = ["root"]

    def walk(names: list[str], prefix: str) -> None:
        for index, name in enumerate(names):
            last = index == len(names) - 1
            lines.append(prefix + ("└── " if last else "├── ") + _line(name, quotas[name]))
            children = quotas[name]["children"]
            walk(children, prefix + ("    " if last else "│   "))

    top = [name for name, quota in quotas.items() if quota["parent"] == "root"]
    walk(sorted(top), "")
    orphans = sorted(
        name for name, quota in quotas.items() if quota["orphan"] and quota["parent"] not in quotas
    )
    if orphans:
        lines.append("orphans (parent missing)")
        walk(orphans, "")
    return lines
