"""Lesson 08's checks: the claims of the core, asserted on the numbers its last cell records (``check(run, numbers)``).

The numbers hold one record per run with the same keys (``runs``: ``without_fix``, ``with_fix``), so
tests/test_checks_can_fail.py can hand each group the other run's record and see every check fail. Two of the three
failures are measured in eras (``eras``: each one's status); where an era did not run, its checks are left out and
the run reports that part as not run. Shares are of tokens, answers or elements: 0 and 1 are what the runs give
(seeds 0-5), and each line sits at 0.5, halfway.
"""

from trl_clinic.course.results import above, below, measured

HALF = 0.5


def prompt_checks(bad: dict, good: dict) -> tuple[dict, dict]:
    """TRL #6105: trl 0.24.0 + transformers 5.5.0 in its era against today's TRL, on the same rows."""
    symptom = {
        "trl 0.24.0 + transformers 5.5.0: every prompt's length taken as 2 (a BatchEncoding's keys)": measured(
            bad["prompt_length_taken"] == [2] * bad["prompt_rows"]
        ),
        "trl 0.24.0 + transformers 5.5.0: over half the prompt tokens are trained": measured(
            above(bad["prompt_trained_share"], HALF)
        ),
        "trl 0.24.0 + transformers 5.5.0: the trainer warns once a row, and nothing stops": measured(
            bad["mismatch_warnings"] == bad["prompt_rows"]
        ),
        "the check-up's prompt_in_loss fails on trl 0.24.0's own trainer": measured(bad["prompt_in_loss"] == "fail"),
    }
    fix = {
        "today's TRL: under half the prompt tokens are trained (none)": measured(
            below(good["prompt_trained_share"], HALF)
        ),
        "today's TRL takes each prompt's full length and warns about none": measured(
            all(length > 2 for length in good["prompt_length_taken"]) and good["mismatch_warnings"] == 0
        ),
        "the check-up's prompt_in_loss is ok on today's trainer": measured(good["prompt_in_loss"] == "ok"),
    }
    return symptom, fix


def turn_checks(bad: dict, good: dict) -> tuple[dict, dict]:
    """Today's TRL, a template with the turn end outside its {% generation %} block against one with it inside."""
    symptom = {
        "turn end outside the mask: over half the greedy answers never end": measured(
            above(bad["never_ended_share"], HALF)
        ),
        "turn end outside the mask: TRL warns at the start, the loss halves all the same": measured(
            bad["trl_warned"] and bad["turn_losses"][-1] < bad["turn_losses"][0] / 2
        ),
        "the check-up's turn_end fails on it": measured(bad["turn_end"] == "fail"),
    }
    fix = {
        "turn end inside the mask: under half the greedy answers never end": measured(
            below(good["never_ended_share"], HALF)
        ),
        "turn end inside the mask: TRL does not warn": measured(not good["trl_warned"]),
        "the check-up's turn_end is ok on it": measured(good["turn_end"] == "ok"),
    }
    return symptom, fix


def qdora_checks(bad: dict, good: dict) -> tuple[dict, dict]:
    """TRL #7268: QDoRA on trl 1.14.2 against trl 1.16.0 (and the workaround on 1.14.2), each in its era."""
    symptom = {
        "trl 1.14.2 keeps DoRA's magnitude in bfloat16": measured(bad["magnitude_dtypes"] == ["bfloat16"]),
        "trl 1.14.2: over half of DoRA's magnitude elements never move": measured(
            above(bad["magnitude_frozen_share"], HALF)
        ),
        "the check-up's stalled_update fails on trl 1.14.2's trainer": measured(bad["stalled_update"] == "fail"),
    }
    fix = {
        "trl 1.16.0 keeps DoRA's magnitude in float32": measured(good["magnitude_dtypes"] == ["float32"]),
        "trl 1.16.0: under half of the magnitude's elements stay frozen": measured(
            below(good["magnitude_frozen_share"], HALF)
        ),
        "trl 1.14.2 with the magnitude cast back to float32: under half stay frozen": measured(
            below(good["workaround_frozen_share"], HALF)
        ),
        "the check-up's stalled_update is ok on trl 1.16.0's trainer": measured(good["stalled_update"] == "ok"),
    }
    return symptom, fix


def checks(n: dict) -> tuple[dict, dict]:
    """Each failure's symptom (the run as launched) and fix (the fixed run), where its runs ran."""
    bad, good = n["runs"]["without_fix"], n["runs"]["with_fix"]
    groups = [turn_checks(bad, good)]
    if n["eras"]["prompt"] == "finished":
        groups.append(prompt_checks(bad, good))
    if n["eras"]["qdora"] == "finished" and n["eras"]["qdora_today"] == "finished":
        groups.append(qdora_checks(bad, good))
    return {k: v for symptom, _ in groups for k, v in symptom.items()}, {
        k: v for _, fix in groups for k, v in fix.items()
    }


def summary(n: dict) -> str:
    """The run in one sentence, from its numbers."""
    bad, good = n["runs"]["without_fix"], n["runs"]["with_fix"]
    said = []
    if n["eras"]["prompt"] == "finished":
        said.append(
            f"trl 0.24.0 + transformers 5.5.0 trained {bad['prompt_trained_share']:.0%} of the prompt tokens "
            f"(today {good['prompt_trained_share']:.0%})"
        )
    said.append(
        f"{bad['never_ended_share']:.0%} of answers never ended with the turn end outside the template's "
        f"mask ({good['never_ended_share']:.0%} inside)"
    )
    if n["eras"]["qdora"] == "finished" and n["eras"]["qdora_today"] == "finished":
        said.append(
            f"trl 1.14.2 froze {bad['magnitude_frozen_share']:.0%} of DoRA's magnitude "
            f"(trl 1.16.0: {good['magnitude_frozen_share']:.0%})"
        )
    probes = {"prompt_in_loss": n["eras"]["prompt"], "turn_end": "finished", "stalled_update": n["eras"]["qdora"]}
    failed = [probe for probe, era in probes.items() if era == "finished" and bad[probe] == "fail"]
    return "; ".join(said) + f"; the check-up failed {', '.join(failed) or 'nothing'} on the runs as launched."
