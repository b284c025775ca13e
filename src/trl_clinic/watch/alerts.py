"""A finding raised as an alert where the run already reports: trackio's and W&B's own alerts.

The trackers are the trainer's ``report_to`` callbacks (transformers 5.23 ``integration_utils.py``):
``TrackioCallback`` keeps the trackio module as ``_trackio`` and starts its run in ``on_train_begin``;
``WandbCallback`` keeps the wandb module as ``_wandb``. trackio 0.43.0: ``Run.alert(title, text, level, step)``
(the module's ``trackio.alert`` has no step), stored in the project's local database; wandb 0.31.0:
``Run.alert(title, text, level, wait_duration)``, kept in the run's ``.wandb`` file offline and sent online. A
finding made before a tracker's run exists (the watch runs ahead of the reporters) waits for the next event. An
alert that fails never stops training: it is dropped with one warning.
"""

from __future__ import annotations

import warnings

from trl_clinic.probes.finding import Finding

TITLE = "trl-clinic: {probe}"  # W&B titles must stay under 64 characters


def _run(callback) -> tuple[object, object] | None:
    """(the tracker's live run, its AlertLevel) for a trackio or W&B callback whose run has started, else None."""
    trackio = getattr(callback, "_trackio", None)
    if trackio is not None:
        run = trackio.context_vars.current_run.get()
        return (run, trackio.AlertLevel) if run is not None else None
    wandb = getattr(callback, "_wandb", None)
    if wandb is not None and getattr(wandb, "run", None) is not None:
        return wandb.run, wandb.AlertLevel
    return None


def trackers(callbacks: list) -> list:
    """The trackio and W&B callbacks among the trainer's callbacks."""
    return [c for c in callbacks if type(c).__name__ in ("TrackioCallback", "WandbCallback")]


def send(pending: list[tuple[Finding, str]], callbacks: list) -> list[tuple[Finding, str]]:
    """Raise each (finding, its printed line) on every tracker whose run has started; what could not be sent yet."""
    waiting = []
    for made, text in pending:
        for callback in trackers(callbacks):
            found = _run(callback)
            if found is None:
                waiting.append((made, text))
                break
            run, level = found
            title = TITLE.format(probe=made.probe)
            try:
                if hasattr(callback, "_trackio"):
                    run.alert(title=title, text=text, level=level.WARN, step=made.step)
                else:
                    run.alert(title=title, text=text, level=level.WARN)
            except Exception as error:  # noqa: BLE001 - a tracker's failure never ends the user's run
                warnings.warn(f"trl-clinic: {type(callback).__name__} alert not sent: {error}", stacklevel=2)
    return waiting
