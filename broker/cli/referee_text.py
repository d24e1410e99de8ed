"""How `trainmaster verify show` tells the refereed tier's ruling (the verdict's `referee` evidence; `--json` has it
all): the tier and its outcome, each miner's root and finding, the bisection's path to the first differing leaf,
the segment replayed and what it settled, and the bytes it took."""

from __future__ import annotations


def referee_lines(evidence: dict) -> list[str]:
    referee = evidence.get("referee") or {}
    if not referee:
        return []
    lines = [f"tier: refereed; {referee.get('outcome', '?')} (pair {', '.join(referee.get('pair') or [])})"]
    roots = referee.get("roots") or {}
    for attempt, finding in (referee.get("findings") or {}).items():
        root = roots.get(attempt)
        lines.append(f"  {attempt}: {finding}" + (f", root {root[:16]}…" if root else "")
                     + (f" — {referee['reasons'][attempt]}" if (referee.get("reasons") or {}).get(attempt) else ""))
    bisection = referee.get("bisection") or {}
    if bisection.get("steps") or "first_differing_leaf" in bisection:
        path = " → ".join(f"[{s['node'][0]},{s['node'][1]}) left {'=' if s['left_equal'] else '≠'}"
                          for s in bisection.get("steps") or [])
        where = (f"first differing leaf {bisection['first_differing_leaf']} "
                 f"({bisection.get('leaves_opened_per_side')} leaves opened per side)"
                 if "first_differing_leaf" in bisection else f"stopped at leaves {bisection.get('node')}")
        lines.append(f"  bisection: {where}" + (f": {path}" if path else ""))
    dispute = referee.get("dispute") or {}
    if dispute:
        segment = dispute.get("replayed_segment")
        what = {"initial": "S_0 built by the broker", "state": f"the state after it (from the agreed S_{dispute.get('from_state')})",
                "trace": "its decisions"}.get(dispute.get("compared"), dispute.get("compared"))
        lines.append(f"  replayed segment {segment}: compared {what}"
                     + (f"; opened by {dispute['opened_by']}" if dispute.get("opened_by") else ""))
    replay = referee.get("replay") or {}
    if replay.get("verifier"):
        lines.append(f"  replayed in {replay['verifier']}")
    meter = referee.get("bytes_downloaded") or {}
    if meter:
        lines.append(f"  downloaded: {meter.get('leaf_bytes', 0):,} bytes of leaf openings, "
                     f"{meter.get('state_bytes', 0):,} bytes of the agreed state")
    return lines
