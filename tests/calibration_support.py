"""Calibration artifacts made by hand for tests (verify/calibration.py): a point from its honest and cheating
distances (`point`), and an artifact of points (`artifact`)."""

from __future__ import annotations

from trainmaster.verify.calibration import Base, Calibration, CalibrationPoint


def point(k: int, honest: float, cheat: float, margin: float = 0.0) -> CalibrationPoint:
    return CalibrationPoint.from_measurements(
        k, {"ulp": [honest / 2, honest]}, {"lr_x0.9": [cheat, 2 * cheat]}, [margin], [5.0, 7.0]
    )


def artifact(*points: CalibrationPoint, name: str = "tiny-lm-x") -> Calibration:
    return Calibration(
        job_class=name, recipe="tiny-lm", config={}, bases=[Base(seed=0, step=20)], created="2025-01-01T00:00:00+00:00",
        environment={"torch": "x"}, points=list(points),
    )
