"""The costs benchmark's figures: each window's counters per accepted job, gross and net of
the idle window's rate, and the webhook delivery's marginal cost (a window with callbacks
less one without)."""

from __future__ import annotations

from typing import Any

from benchmarks.lib.costs.observer import Flat


def per_job(raw: Flat, jobs: int, idle: Flat | None = None, seconds: float = 0.0) -> Flat:
    """Each counter per job; less ``idle`` (per second) x ``seconds`` first, when given."""
    if jobs <= 0:
        return {}
    base = idle or {}
    return {k: (v - base.get(k, 0.0) * seconds) / jobs for k, v in raw.items()}


def nest(flat: Flat, digits: int = 3) -> dict[str, Any]:
    """Dotted names as nested dicts: {"cpu_ms.api": 1} -> {"cpu_ms": {"api": 1}}."""
    out: dict[str, Any] = {}
    for key, value in sorted(flat.items()):
        *path, last = key.split(".")
        node = out
        for part in path:
            node = node.setdefault(part, {})
        node[last] = round(value, digits)
    return out


def keep(flat: Flat) -> Flat:
    """The counters of the per-job figures (not the benchmark's own, not checkpoints)."""
    own = ("cpu_ms.observer_backend", "cpu_ms.load_generator", "checkpoints")
    return {k: v for k, v in flat.items() if k not in own}


def delivery_cost(with_cb: Flat, without: Flat) -> dict[str, Any]:
    """The callback's marginal cost: a window with callbacks less one without, per job."""
    diff = {k: with_cb.get(k, 0.0) - without.get(k, 0.0) for k in with_cb.keys() | without}
    return {
        "cpu_ms_webhooks": round(diff.get("cpu_ms.webhooks", 0.0), 3),
        "cpu_ms_all": round(sum(v for k, v in diff.items() if k.startswith("cpu_ms.")), 3),
        "pg_statements": round(diff.get("pg.statements", 0.0), 3),
        "pg_transactions": round(diff.get("pg.transactions", 0.0), 3),
        "wal_bytes": round(diff.get("pg.wal_bytes", 0.0), 1),
        "rows_written": round(diff.get("pg.rows_written", 0.0), 3),
        "detail": nest(diff),
    }


def figures(windows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per job by window (gross, and net of the idle rate), the idle rates, and the
    webhook delivery's marginal cost."""
    idle = windows["idle"]
    idle_rate = {k: v / idle["window_s"] for k, v in keep(idle["raw"]).items()}
    gross, net = {}, {}
    for name, w in windows.items():
        if name == "idle" or not w["jobs_accepted"]:
            continue
        raw = keep(w["raw"])
        gross[name] = per_job(raw, w["jobs_accepted"])
        net[name] = per_job(raw, w["jobs_accepted"], idle_rate, w["window_s"])
    out: dict[str, Any] = {
        "idle_per_s": nest(idle_rate, 4),
        "per_job_by_window": {k: nest(v) for k, v in gross.items()},
        "per_job_net_of_idle_by_window": {k: nest(v) for k, v in net.items()},
        "per_ended_job_cpu_ms": {
            name: {
                k.split(".", 1)[1]: round(v / w["jobs_ended"], 3)
                for k, v in keep(w["raw"]).items()
                if k.startswith("cpu_ms.") and w["jobs_ended"]
            }
            for name, w in windows.items()
            if name != "idle"
        },
    }
    if "single" in gross:
        out["per_job"] = nest(gross["single"])
        out["per_job_net_of_idle"] = nest(net["single"])
    if "single" in gross and "single_callback" in gross:
        out["per_job"]["webhook_delivery"] = delivery_cost(
            gross["single_callback"], gross["single"]
        )
        out["per_job_net_of_idle"]["webhook_delivery"] = delivery_cost(
            net["single_callback"], net["single"]
        )
    if "batch" in gross:
        out["per_job"]["batch_path"] = nest(gross["batch"])
        out["per_job_net_of_idle"]["batch_path"] = nest(net["batch"])
    return out


def notes(windows: dict[str, dict[str, Any]]) -> list[str]:
    """What a reader of the figures should know about this run's windows."""
    out = []
    for name, w in windows.items():
        raw = w["raw"]
        if raw.get("checkpoints", 0) > 0:
            out.append(
                f"{name}: a checkpoint fell in the window; its WAL includes "
                f"{raw['pg.wal_fpi']:.0f} full-page images"
            )
        if w["jobs_ended"] < w["jobs_accepted"]:
            out.append(f"{name}: {w['jobs_accepted'] - w['jobs_ended']} jobs did not end")
        deleted = sum(
            v for k, v in raw.items() if k.startswith("pg.rows_by_table_op.") and k.endswith(".del")
        )
        if deleted:
            out.append(f"{name}: {deleted:.0f} rows were deleted (pruned) in the window")
    return out
