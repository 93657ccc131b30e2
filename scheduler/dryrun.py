"""From a plan and the hardware to a placement a person can check before anything runs (``submit --dry-run``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler import hardware as hw
from scheduler.errors import UserError
from scheduler.packing import Demand, Placement, pack
from scheduler.plan import Plan


@dataclass
class DryRun:
    plan: Plan
    hardware: hw.Hardware
    placement: Placement
    warnings: list[str] = field(default_factory=list)

    def job_rows(self) -> list[dict]:
        rows = []
        for job in self.plan.jobs:
            a = self.placement.of(job.name)
            row = {
                "name": job.name,
                "kind": job.kind,
                "wave": a.wave,
                "node": a.node,
                "device": a.device,
                "gpu_memory_mib": a.gpu_memory_mib,
                "cpus": a.cpus,
            }
            if getattr(job, "batch_size", None) is not None:
                row["batch_size"] = job.batch_size
            row["reason"] = a.reason
            rows.append(row)
        return rows

    def device_rows(self) -> list[dict]:
        """One row per (wave, device) that holds a job, with its load against the band."""
        low, high = self.plan.band
        rows = []
        for wave in range(self.placement.waves):
            for dev in self.placement.devices:
                jobs = self.placement.jobs_on(wave, dev)
                if not jobs and wave > 0:
                    continue
                load = self.placement.load_mib(wave, dev)
                share = load / dev.memory_mib
                rows.append({
                    "wave": wave, "node": dev.node, "device": dev.index, "memory_mib": dev.memory_mib,
                    "jobs": [a.job for a in jobs], "used_mib": load, "share": round(share, 4),
                    "in_band": low <= share <= high + 1e-9,
                })
        return rows

    def to_json(self) -> dict:
        low, high = self.plan.band
        return {
            "plan": self.plan.name,
            "hardware": self.hardware.to_json(),
            "band": {"low": low, "high": high},
            "waves": self.placement.waves,
            "exact": self.placement.exact,
            "jobs": self.job_rows(),
            "devices": self.device_rows(),
            "warnings": list(self.warnings),
        }


def resolve_hardware(plan: Plan, override: str | None = None) -> hw.Hardware:
    """The plan's hardware, or ``override`` (``--hardware``) in its place; counts in the plan still apply."""
    spec = plan.hardware
    return hw.resolve(override or spec.profile, gpus_per_node=spec.gpus_per_node, nodes=spec.nodes, cpus=spec.cpus)


def demands(plan: Plan) -> list[Demand]:
    out = []
    for job in plan.jobs:
        mib = job.resources.gpu_memory
        if job.needs_estimate:
            raise UserError(
                f"job '{job.name}': resources.gpu_memory is not given; write it (e.g. gpu_memory: 18GB)"
            )
        out.append(Demand(job.name, mib or 0, job.resources.cpus))
    return out


def prepare(plan: Plan, hardware: hw.Hardware) -> DryRun:
    """Pack ``plan`` onto ``hardware`` and collect what a person should know before running it."""
    placement = pack(demands(plan), hardware.nodes, plan.band)
    warnings: list[str] = []
    if not hardware.devices and any(d.gpu_memory_mib for d in demands(plan)):
        raise UserError(f"plan '{plan.name}' has GPU jobs but hardware '{hardware.profile}' has no GPU")
    low, high = plan.band
    for row in DryRun(plan, hardware, placement).device_rows():
        if row["jobs"] and row["share"] < low:
            warnings.append(
                f"wave {row['wave']}, device {row['node']}:{row['device']}: {row['used_mib']} MiB is "
                f"{row['share']:.0%} of the card, under the band's lower limit ({low:.0%}); room for more work"
            )
    if placement.waves > 1:
        later = [a.job for a in placement.assignments if a.wave > 0]
        warnings.append(f"{len(later)} job(s) wait for a later wave: {', '.join(later)}")
    if not placement.exact:
        warnings.append("the plan is too large to pack exactly in time; this placement is First-Fit-Decreasing's")
    return DryRun(plan, hardware, placement, warnings)
