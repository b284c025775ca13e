"""Lesson 05 deep dive's checks: the claims of the deep dive, asserted on the numbers its last cell records
(``check(run, numbers)``).

They see nothing but those numbers (as metrics.json stores them), so tests/test_checks_can_fail.py can hand them the
other run's numbers and see each one fail; ``summary`` is the sentence the workbook's report shows, written from the
same numbers.
"""

from trl_clinic.course.results import above, below, injected, measured


def native_checks(native: dict) -> dict:
    """Section 1: a native crash, as the child that divided left it."""
    return {
        "a torch kernel's overflowing division traps: the child dies by SIGFPE (-8) inside native_sigfpe, before "
        "the line after it": measured(
            native["signal"] == "SIGFPE"
            and native["returncode"] == -8
            and not native["division_returned"]
            and native["died_in_native_sigfpe"]
        ),
        "from a shell it is 'Floating point exception', exit status 136, and nothing of its own": measured(
            "Floating point exception" in (native["shell_says"] or "")
            and native["shell_returncode"] == 136
            and native["shell_python_said_nothing"]
        ),
    }


def config_checks(bad: dict, verdicts: dict, groups: dict) -> dict:
    """Sections 2 and 5: today's GRPOConfig on the report's config, and the bisection of its error."""
    walk, rule, found = bad["walk"], bad["rule"], bad["config_bisection"]
    expected = {b: int(b) * groups["accumulation"] % groups["num_generations"] == 0 for b in verdicts}
    return {
        "today's TRL rejects the report's config three times (2 TypeErrors, the "
        "generation batch), then accepts it": measured(
            [step["error"].split(":")[0] if step["error"] else None for step in walk]
            == ["TypeError", "TypeError", "ValueError", None]
            and "divisible by num_generations" in walk[2]["error"]
        ),
        "today's GRPOConfig accepts exactly the per-device batches whose generation batch holds whole groups": measured(
            {b: error is None for b, error in verdicts.items()} == expected and len(set(expected.values())) == 2
        ),
        "per-device 1 x accumulation 4 is rejected for 16 generations: a generation batch of 4": measured(
            bool(rule) and all(row["error"] and "generation_batch_size (4)" in row["error"] for row in rule)
        ),
        "bisecting today's real config error names per_device_train_batch_size alone": measured(
            found["culprits"] == ["per_device_train_batch_size"]
        ),
        "the real config error's message does not name the guilty setting": measured(
            bool(found["message"])
            and bool(found["culprits"])
            and not any(name in found["message"] for name in found["culprits"])
        ),
    }


def symptom_checks(n: dict) -> dict:
    """The failures, on the side without the fix (each section's numbers in n["runs"]["without_fix"])."""
    bad = n["runs"]["without_fix"]
    return {
        **native_checks(bad["native"]),
        **config_checks(bad, n["verdicts"], n["verdict_rule"]),
        "bisection in child processes names bf16 (the injected stand-in)": injected(
            bad["crash_bisection"]["culprits"] == ["bf16"]
        ),
        "with the all-or-nothing reward nearly every group is equal (mean frac_reward_zero_std > 0.75)": measured(
            above(bad["zero_std"]["mean_frac_reward_zero_std"], 0.75)
        ),
    }


def fix_checks(n: dict) -> dict:
    """The same sections with the fix (n["runs"]["with_fix"]), and the report's TRL."""
    fixed = n["runs"]["with_fix"]
    trials = fixed["crash_bisection"]["trials"]
    fix = {
        "the walk's last config (warmup renamed, no max_prompt_length, "
        "per-device 4) is accepted as it stands": measured([step["error"] for step in fixed["walk"]] == [None]),
        "generation_batch_size=16 or steps_per_generation=16 makes the "
        "generation batch 16, and it is accepted": measured(
            bool(fixed["rule"])
            and all(row["error"] is None and row["generation_batch_size"] == 16 for row in fixed["rule"])
        ),
        "with bf16=False the user's whole config trains in a child with the stand-in attached": injected(
            any(t["phase"] == "all" for t in trials)
            and all(t["status"] == "finished" for t in trials if t["phase"] == "all")
        ),
        "partial credit on the same policy gives over a quarter of the groups unequal rewards (mean "
        "frac_reward_zero_std < 0.75)": measured(below(fixed["zero_std"]["mean_frac_reward_zero_std"], 0.75)),
    }
    return {**fix, **era_checks(n["then"])}


def era_checks(then: dict) -> dict:
    """Section 4: the report's TRL in its side environment (absent when it did not run; in a test, today's TRL's
    answers to the same questions stand in its place)."""
    if then["status"] != "finished":
        return {}
    return {
        f"TRL {then['trl']} accepts the report's config as written and trains with it": measured(
            then["accepted"] and then["optimizer_steps"] >= 1
        ),
        f"TRL {then['trl']} counts prompts: per-device batch 1 gives 16 completions a micro-batch": measured(
            set(then["completions_per_call"] or []) == {16} and "prompts" in then["batch_help"]
        ),
        f"TRL {then['trl']}'s GRPOConfig runs in fp32 unless bf16 is named": measured(then["default_bf16"] is False),
    }


def checks(n: dict) -> tuple[dict, dict]:
    return symptom_checks(n), fix_checks(n)


def summary(n: dict) -> str:
    """The deep dive in one sentence, from its numbers."""
    bad, fixed = n["runs"]["without_fix"], n["runs"]["with_fix"]
    native, crash = bad["native"], bad["crash_bisection"]
    return (
        f"A torch kernel's overflowing division killed its child by "
        f"{native['signal'] or 'nothing'} with no message (exit {native['shell_returncode']} "
        f"from a shell); bisection named {', '.join(bad['config_bisection']['culprits'] or [])} for today's config "
        f"error and {', '.join(crash['culprits'] or [])} for the injected crash in {len(crash['trials'])} child runs "
        f"(nothing with bf16=False); an all-or-nothing reward left "
        f"{bad['zero_std']['mean_frac_reward_zero_std']:.0%} of groups equal, partial "
        f"credit {fixed['zero_std']['mean_frac_reward_zero_std']:.0%}; TRL 0.14.0 "
        f"{'accepts' if n['then'].get('accepted') else 'was not run on'} the report's config."
    )
