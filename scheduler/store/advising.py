"""``advise``'s wiring: the competition read, the estimator and the time model corrected by this machine's
measurements (``store/measurements.py``), the pure planner (``policy/planning/advise.py``), and the plan it writes checked the
way ``submit`` will read it (loaded, estimated, packed) before anyone runs it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from scheduler.core import kinds
from scheduler.core import plan as planmod
from scheduler.core.errors import UserError
from scheduler.policy.planning import advise as adv
from scheduler.policy.planning import dryrun
from scheduler.policy.timing import timemodel
from scheduler.store import datasource, measurements


@dataclass
class Advised:
    advice: adv.Advice
    yaml: str
    dry: dryrun.DryRun  # the plan as submit will pack it

    def to_json(self) -> dict:
        body = self.advice.to_json()
        body["yaml"] = self.yaml
        body["placement"] = {"waves": self.dry.placement.waves,
                             "devices": [{k: r[k] for k in ("wave", "jobs", "used_mib", "share", "in_band")}
                                         for r in self.dry.device_rows()],
                             "warnings": list(self.dry.warnings)}
        return body


def measured_speeds(model: str, image_size: int, card: str, *, amp: bool = True,
                    channels_last: bool = True) -> dict[int, float]:
    """{batch: training images/s} that gpupack measured for this model, image size and precision on ``card``."""
    try:
        found = measurements.measured_batches(measurements.Config(model, image_size, 0,
                                                                  measurements.precision_of(amp), card,
                                                                  channels_last=channels_last))
    except Exception:  # noqa: BLE001 -- an unreadable cache costs a correction, not the advice
        return {}
    return {b: m.train_samples_per_s for b, m in found.items() if m.train_samples_per_s}


def speed(model: str, image_size: int, batch: int, card: str, *, amp: bool = True,
          channels_last: bool = True) -> timemodel.Speed | None:
    """The time model's figure, corrected by what this machine measured."""
    return timemodel.speed(model, image_size, batch, card=card, amp=amp, channels_last=channels_last,
                           measured=measured_speeds(model, image_size, card, amp=amp, channels_last=channels_last))


def memory(card: str, sources: dict | None = None):
    """(model, image size, batch) -> MiB on ``card``: measured before computed, as ``submit``'s dry run packs it;
    each figure's source goes into ``sources``."""
    from scheduler.policy.memory.estimate import figure

    measured = measurements.memory_source()

    def mib(model: str, image_size: int, batch: int) -> int:
        f = figure(model, image_size, batch, card=card, measured=measured)
        if sources is not None:
            sources[model, image_size, batch] = f.source
        return f.mib

    return mib


def facts(data: str | None, metric: str | None) -> adv.DataFacts:
    """What the competition is: ``data`` a folder or a built-in name (None: digits)."""
    from jobs import shelf
    from jobs.data import load_competition

    choice = datasource.choose(data, None, None)
    folder = datasource.materialised(choice.builtin) if choice.builtin else choice.dir
    comp = load_competition(folder, metric)
    if metric is None:
        metric = shelf.get(choice.builtin).metric if choice.builtin else guess_metric(comp)
        comp = load_competition(folder, metric)
    written = None if choice.builtin == "digits" and data is None else \
        (choice.builtin if choice.builtin else str(Path(choice.dir).resolve()))
    return adv.DataFacts(rows=len(comp.train), test_rows=len(comp.test), images=comp.has_images, task=comp.task,
                         metric=metric, features=len(comp.feature_cols),
                         classes=len(comp.classes) if comp.task == "classification" else None,
                         label=choice.label(), data=written)


def guess_metric(comp) -> str:
    """A metric for a folder that names none: rmse for a numeric target with fractions or many distinct values (more
    than 20 and 5 % of the rows), auc for a probability column, log_loss for one column per class, else accuracy
    (``--metric`` says otherwise)."""
    from jobs.forms import numbers

    if comp.form.kind == "targets":
        return "rmse"
    target = numbers(comp.train[comp.target_col])  # read as text; None when some value is no number
    if target is not None and ((target.round() != target).mean() > 0.05
                               or target.nunique() > max(20, 0.05 * len(target))):
        return "rmse"
    return {"probability": "auc", "class_columns": "log_loss"}.get(comp.form.kind, "accuracy")


def advise(*, hardware: str, budget: str, data: str | None = None, metric: str | None = None,
           models: list[str] | None = None, cpus: int | None = None, name: str = "advised") -> Advised:
    try:
        budget_s = planmod.parse_budget_s(budget)
    except ValueError as e:
        raise UserError(f"--budget: {e}") from None
    if metric is not None and metric not in planmod.METRICS:
        raise UserError(f"--metric: unknown metric '{metric}'; allowed: {', '.join(planmod.METRICS)}")
    image, _ = adv.candidates(tuple(models) if models else None)
    for m in models or []:  # a network the image kind's plan entry takes, or a table kind
        if m not in adv.table_kinds():
            if image is None:
                raise UserError(f"--models {m}: no kind trains on images; name a table kind: "
                                f"{', '.join(adv.table_kinds())}")
            try:
                planmod.job_from_dict({"name": m, "kind": image.name, **image.entry(kinds.Work(model=m))},
                                      f"--models {m}")
            except UserError as e:
                raise UserError(f"{e} (or name a table kind: {', '.join(adv.table_kinds())})") from None
    from scheduler.core import hardware as hw

    machine = hw.from_profile(hardware, cpus=cpus)
    if len(machine.devices) != 1:
        raise UserError(f"--hardware {hardware}: advise plans one card ({len(machine.devices)} given); name one "
                        f"profile, e.g. {machine.profile}")
    hardware = machine.profile
    f = facts(data, metric)
    req = adv.Request(card=hardware, budget=budget, budget_s=budget_s, cpus=cpus,
                      models=tuple(models) if models else None, name=name)
    sources: dict = {}
    advice = adv.advise(f, req, adv.Tools(memory=memory(hardware, sources), speed=speed))
    for j in advice.jobs:
        if kinds.get(j["kind"]).gpu == "estimated":  # its share came from the estimator: say which figure
            j["gpu_memory_source"] = sources.get((j["model"], j["image_size"], j["batch_size"]), "computed")
    text = to_yaml(advice, f)
    plan = planmod.from_dict(yaml.safe_load(text), source="the advised plan")
    dry = dryrun.prepare(plan, dryrun.resolve_hardware(plan), train_rows=f.rows, measured=measurements.memory_source(),
                         speed=speed)
    if dry.changes:  # the planner and submit's fitter disagree: say so rather than hide it
        advice.reasons.append("submit will change: " + "; ".join(dry.changes))
    return Advised(advice, text, dry)


def to_yaml(advice: adv.Advice, f: adv.DataFacts) -> str:
    head = (f"# Written by `gpupack advise` for {f.label or 'the competition'} ({f.rows:,} train rows): estimated "
            f"finish {advice.finish_s:.0f} s of a {advice.window_s:.0f} s training window (target "
            f"{adv.MARGIN:.0%}: {advice.target_s:.0f} s).\n# Run it: python -m scheduler submit THIS_FILE\n")
    return head + yaml.safe_dump(advice.plan, sort_keys=False, default_flow_style=None, width=120)
