"""Study 7: tool use when the tool is needed (benchmarks/results/study7.md, the plan, written before any run)

    python benchmarks/study7.py --slots 2                          # the study: 2 environments × 3 arms × 2 bases × 3 seeds
    python benchmarks/study7.py --smoke --work /tmp/study7_smoke   # its smoke check (minutes; numbers are not results)
    python benchmarks/study7.py --report-only                      # the report from the work folder alone

The multi-turn CPU demo's two environments (docs/agents.md): the countdown checker
(``configs/demo/agents/``), where the tool is optional, and the SQL toy (``configs/demo/sql_agent/``),
where it is needed (no question names its database's table). In each: GRPO, DPH-F (the environment's
multi-turn reference cache) and GRPO with the tool-call bonus (``tool_call`` at weight 0.1, verl PR
#4998's), 2 bases × 3 seeds, study 5's setting (:data:`STUDY7`). Each environment's bases are its own
warm starts (seeds 0 and 1) and reference caches; every run 120 steps of 8 prompts × 8 trajectories, the
in-training validation every 20 steps (the curves), then ``lit-rlvr validate`` with the environment's
``record.yaml`` (64 held-out prompts × 8 trajectories). The directions of :data:`HYPOTHESES` are judged by
study 3's rule on the paired differences over base × seed, per environment. Work folder
``artifacts/study7``; report ``benchmarks/results/study7_results.md`` with ``study7_curves.png`` and
``study7_behaviour.png`` (``--smoke``: in the work folder).
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass
from pathlib import Path

import study3
import study4
import study_runner
import study_stats
import tool_use
from study_methods import NAMES


@dataclass(frozen=True)
class Env:
    """One environment of the study: its configs folder, its held-out set and its bases' warm-start steps."""

    configs: str
    val: str
    warm_steps: int
    title: str


ENVS = {
    "countdown": Env("configs/demo/agents", "countdown_val", 150, "countdown checker (tool optional)"),
    "sql": Env("configs/demo/sql_agent", "sql_agent_val", 300, "SQL toy (tool needed)"),
}


@dataclass(frozen=True)
class Study7Setting:
    """What a work folder runs: the plan's (:data:`STUDY7`) or the smoke check's (:data:`SMOKE`: never a result)."""

    bases: tuple[int, ...]
    seeds: tuple[int, ...]
    steps: int  # RL steps of every job (8 prompts × 8 trajectories each)
    val_every: int  # in-training validation (2 × 16 held-out prompts) every this many steps: the curves
    warm_steps: tuple[int, ...] | None = None  # the bases' warm-start steps per environment (None: each Env's)
    validate_flags: tuple[str, ...] = ()  # added to every final validation

    def warm(self, env: str) -> int:
        return ENVS[env].warm_steps if self.warm_steps is None else self.warm_steps[list(ENVS).index(env)]


STUDY7 = Study7Setting(bases=(0, 1), seeds=(0, 1, 2), steps=120, val_every=20)
SMOKE = Study7Setting(
    bases=(0,), seeds=(0,), steps=2, val_every=1, warm_steps=(5, 5), validate_flags=("--trainer.limit_val_batches=1",)
)
BONUS = [  # docs/agents.md's tool-call bonus: each row's own reward, + 0.1 for a trajectory that called a tool
    "--model.scoring.reward_funcs=[row, tool_call]",
    "--model.scoring.reward_weights=[1.0, 0.1]",
    "--model.scoring.correctness=row",
]
# arm: (<env configs>/<config>.yaml, the flags beyond it); the order inside a block
ARMS: dict[str, tuple[str, list[str]]] = {"grpo": ("grpo", []), "dph_f": ("dph_f", []), "tool_call": ("grpo", BONUS)}


def variant(env: str, arm: str) -> str:
    """A run's variant: ``<env>_<arm>``; each environment's bases are ``<env>_base``."""
    return f"{env}_{arm}"


def env_of(v: str) -> str:
    return v.split("_", 1)[0]


def name(v: str) -> str:
    """``countdown_tool_call`` → ``GRPO + tool-call bonus``; ``sql_base`` → ``its base``."""
    arm = v.split("_", 1)[1]
    return "its base" if arm == "base" else NAMES[arm]


def jobs(setting: Study7Setting = STUDY7) -> list[study_runner.Job]:
    """Every arm in every environment on every base × seed, in study 3's block order; inside a block the
    countdown checker's arms, then the SQL toy's, each in :data:`ARMS` order."""
    blocks = [(b, s) for b, s in study3.STUDY3_BLOCKS if b in setting.bases and s in setting.seeds]
    return [
        study_runner.Job(variant(env, arm), config, b, s, list(flags), steps=setting.steps, domain=env)
        for b, s in blocks
        for env in ENVS
        for arm, (config, flags) in ARMS.items()
    ]


class AgentStudy(tool_use.ToolStudy):
    """:class:`tool_use.ToolStudy` on both environments' configs: each job's ``domain`` names its :data:`ENVS` entry."""

    def base_dir(self, seed: int, domain: str = "countdown", warm: str = "") -> Path:
        return self.work / f"base_{domain}" / f"s{seed}"

    def base_label(self, base_seed: int, seed: int, domain: str, warm: str = "") -> str:
        return f"{variant(domain, 'base')}/b{base_seed}/s{seed}"

    def bases(self) -> list[tuple[Path, str, int, int, str]]:
        """Per environment and base seed: its warm start and multi-turn reference cache (:meth:`ToolStudy.prepare`)."""
        return [
            (self.base_dir(s, e), ENVS[e].configs, s, self.setting.warm(e), f"{e}_s{s}")
            for e in ENVS
            for s in self.setting.bases
        ]

    def configs_of(self, domain: str) -> str:
        return ENVS[domain].configs


def run(study: AgentStudy) -> None:
    """The plan: bases and caches, the bases' validations, then every job (a rerun skips what is recorded)."""
    study4.claim_work(study.work, study.setting, study4.machine_record(study.slots))
    study.prepare()
    study.run(jobs(study.setting))


# study7.md's table, written before any run: (name, variant, against, {metric: signs allowed}, source)
HYPOTHESES = (
    study_stats.Hypothesis(
        "A1",
        "countdown_grpo",
        "countdown_base",
        {"tool_calls": "-", "single_turn": "+"},
        "study 5's T1 replicated (GRPO − base: tool calls 0.633 → 0.243, single-turn share 0.433 → 0.766)",
    ),
    study_stats.Hypothesis(
        "A2",
        "countdown_dph_f",
        "countdown_grpo",
        {"tool_calls": "+", "distinct_tool_sequences": "+"},
        "study 5's T2 replicated (DPH-F kept the checks: 0.611 tool calls, 5.12 distinct sequences against GRPO's 0.243, 2.75)",
    ),
    study_stats.Hypothesis(
        "A3",
        "sql_grpo",
        "sql_base",
        {"tool_calls": "+=", "single_turn": "-="},
        "the task: an answer without the query guesses the table, right 1 time in 10 (docs/agents.md); the one-run "
        "demo (docs/results.md): single-turn share 0.217 → 0.137 under GRPO",
    ),
    study_stats.Hypothesis(
        "A4",
        "sql_grpo",
        "sql_base",
        {"distinct_tool_sequences": "-"},
        "study 5: GRPO halved the distinct tool sequences where the tool was optional (5.28 → 2.75); the collapse "
        "of diversity under GRPO (studies 1–4) should reach the queries too",
    ),
    study_stats.Hypothesis(
        "A5",
        "sql_dph_f",
        "sql_grpo",
        {"distinct_tool_sequences": "+"},
        "study 5's T2 carried to a needed tool: DPH-RL's forward KL to the base keeps its modes (arXiv 2509.07430)",
    ),
    study_stats.Hypothesis(
        "A6",
        "countdown_tool_call",
        "countdown_grpo",
        {"tool_calls": "+", "single_turn": "-"},
        "verl PR #4998: +0.1 for a trajectory that calls a tool kept the calls that GRPO dropped (verl issue #1569)",
    ),
    study_stats.Hypothesis(
        "A7",
        "countdown_tool_call",
        "countdown_base",
        {"distinct_tool_sequences": "-"},
        "docs/agents.md: the bonus pays for calling, not for calling well; a call before every answer is one "
        "sequence the bonus and the reward both favour",
    ),
    study_stats.Hypothesis(
        "A8",
        "sql_tool_call",
        "sql_grpo",
        {"tool_calls": "+=", "distinct_tool_sequences": "-="},
        "where GRPO already queries (A3) the bonus can add few calls, and it pays for none of their diversity",
    ),
)
# reported with the sign the rule gives, not judged
NOT_JUDGED = [
    (variant(e, a), variant(e, b))
    for e in ENVS
    for a, b in (("grpo", "base"), ("dph_f", "base"), ("tool_call", "base"), ("dph_f", "grpo"), ("tool_call", "grpo"))
]
METRICS = ("pass@1", "pass@8", "tool_calls", "single_turn", "distinct_tool_sequences")


def key(v: str, metric: str) -> str:
    return f"val/{ENVS[env_of(v)].val}/{metric}"


def judge(by: dict, v: str, against: str, metric: str, want: str | None) -> str:
    """One part of a hypothesis: the paired difference, the sign study 3's rule gives and, with ``want``, MET or MISS."""
    diffs = study_stats.paired(by, v, key(v, metric), against)
    subject = f"{ENVS[env_of(v)].title}: {name(v)} − {name(against)}, {tool_use.TITLES[metric]}"
    if not diffs:
        return f"- {subject}: not run"
    return study_stats.sign_line(diffs, subject, want, pairs="pairs")


def verdicts(by: dict) -> list[str]:
    lines = []
    for h in HYPOTHESES:
        parts = [judge(by, h.variant, h.against, m, want) for m, want in h.allowed.items()]
        held = study_stats.verdict(parts, [tool_use.TITLES[m] for m in h.allowed])
        lines += [
            f"\n**{h.name}: {held}** — {ENVS[env_of(h.variant)].title}: {name(h.variant)} − {name(h.against)}; "
            f"source: {h.source}.\n",
            *parts,
        ]
    lines += ["\nNot judged (reported with the sign the rule gives):\n"]
    lines += [judge(by, v, a, m, None) for v, a in NOT_JUDGED for m in METRICS]
    return lines


def table(by: dict, env: str, arms: list[str], against: str | None = None) -> list[str]:
    """Per arm of ``env``: mean ± 95% CI (worst run) of the final validation's numbers, or with ``against`` (an arm
    or ``base``) the paired differences to it on the same base × seed."""
    columns = [*(f"pass@{k}" for k in tool_use.LADDER), *tool_use.BEHAVIOUR]
    head = "method" if against is None else f"method − {name(variant(env, against))}"
    lines = [
        f"| {head} | runs | " + " | ".join(("Δ " if against else "") + tool_use.TITLES[c] for c in columns) + " |",
        "|---|---|" + "---|" * len(columns),
    ]
    for arm in arms:
        v = variant(env, arm)
        if against is None:
            values = [[r[key(v, c)] for r in by.get(v, []) if key(v, c) in r] for c in columns]
        else:
            values = [study_stats.paired(by, v, key(v, c), variant(env, against)) for c in columns]
        if values[0]:
            digits = [2 if c in ("turns", "distinct_tool_sequences") else 3 for c in columns]
            cells = [study_stats.cell(x, d, signed=against is not None) for x, d in zip(values, digits)]
            label = "base" if arm == "base" else NAMES[arm]
            lines.append(f"| {label} | {len(values[0])} | " + " | ".join(cells) + " |")
    return lines


def behaviour_plot(by: dict, out: Path, title: str) -> None:
    """Per environment: tool calls against distinct tool sequences (left), pass@1 against tool calls (right), each
    arm's and the base's mean ± 95% CI, its runs as dots."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 10))
    colours = {"base": "black", **{a: plt.cm.tab10(i) for i, a in enumerate(ARMS)}}
    for row, env in zip(axes, ENVS):
        for ax, (x, y) in zip(row, (("tool_calls", "distinct_tool_sequences"), ("tool_calls", "pass@1"))):
            for arm in ("base", *ARMS):
                v = variant(env, arm)
                rs = [r for r in by.get(v, []) if key(v, x) in r and key(v, y) in r]
                if not rs:
                    continue
                xs, ys = [r[key(v, x)] for r in rs], [r[key(v, y)] for r in rs]
                ax.scatter(xs, ys, s=12, alpha=0.35, color=colours[arm])
                err = [0 if math.isnan(study_stats.ci(vs)) else study_stats.ci(vs) for vs in (xs, ys)]
                ax.errorbar(
                    study_stats.mean(xs),
                    study_stats.mean(ys),
                    xerr=err[0],
                    yerr=err[1],
                    capsize=3,
                    color=colours[arm],
                    label="base" if arm == "base" else NAMES[arm],
                    marker="*" if arm == "base" else "o",
                    markersize=11 if arm == "base" else 7,
                )
            ax.set(
                xlabel=f"held-out {tool_use.TITLES[x]}",
                ylabel=f"held-out {tool_use.TITLES[y]}",
                title=ENVS[env].title,
            )
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


def curves_plot(study: AgentStudy, by: dict, out: Path, title: str) -> None:
    """Per environment (a row each): the training rollouts' reward, tool calls, single-turn share and distinct tool
    sequences over training, each arm's mean over its runs ± 95% CI."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 4, figsize=(18, 8))
    colours = {a: plt.cm.tab10(i) for i, a in enumerate(ARMS)}
    for row, env in zip(axes, ENVS):
        for ax, column in zip(row, ("reward", "tool_calls", "single_turn", "distinct_tool_sequences")):
            for arm in ARMS:
                labels = [r["label"] for r in by.get(variant(env, arm), [])]
                steps, mu, h = tool_use.mean_curve(study, labels, f"train/{column}") if labels else ([], [], [])
                if steps:
                    ax.plot(steps, mu, color=colours[arm], label=NAMES[arm])
                    lo, hi = [a - b for a, b in zip(mu, h)], [a + b for a, b in zip(mu, h)]
                    ax.fill_between(steps, lo, hi, color=colours[arm], alpha=0.15)
            ax.set_title(f"{ENVS[env].title}: {tool_use.TITLES.get(column, column)}", fontsize=9)
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
        row[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


def write_report(study: AgentStudy, out: Path, curves: Path, behaviour: Path) -> None:
    """The report study7.md declares, from the work folder alone; per environment, its complete base × seed blocks only."""
    setting, smoke = study.setting, study.setting != STUDY7
    by = study_stats.group(study.records())
    planned = jobs(setting)
    missing = [j.label for j in planned if j.label not in study.done_labels()]
    kept, blocks_line = {}, []
    for env in ENVS:
        variants = [variant(env, a) for a in ARMS]
        blocks = study3.complete_blocks(by, variants)
        kept.update(study_stats.in_blocks({v: by.get(v, []) for v in [*variants, variant(env, "base")]}, blocks))
        cut = sorted(
            r["label"]
            for v in [*variants, variant(env, "base")]
            for r in by.get(v, [])
            if study_stats.block_of(r) not in blocks
        )
        shown = ", ".join(f"({b}, {s})" for b, s in blocks) or "none"
        blocks_line.append(
            f"- {ENVS[env].title}: complete blocks (all {len(ARMS)} arms recorded) {shown} ({len(blocks)} of "
            f"{len(planned) // len(ARMS) // len(ENVS)}); runs of incomplete blocks, left out: {', '.join(f'`{c}`' for c in cut) or 'none'}"
        )
    by = kept
    sections = [
        "# Study 7: tool use when the tool is needed\n",
        *(
            [
                "**SMOKE CHECK (`--smoke`): 5-step bases, 2 RL steps, 16 validation prompts. It shows the pipeline runs; "
                "its numbers are not results.**\n"
            ]
            if smoke
            else []
        ),
        "Plan, hypotheses and rule committed before these runs: [`study7.md`](study7.md). Command: "
        f"`python benchmarks/study7.py{' --smoke' if smoke else ''} --slots 2`; every record in "
        f"`{study_runner._shown(study.metrics)}`, each run's `lit-rlvr` commands in `{study_runner._shown(study.work / 'logs')}`"
        + study_runner.seconds_note(study.work)
        + f". Bases: each environment's warm start ({', '.join(f'{e} {setting.warm(e)} steps' for e in ENVS)}) with seeds "
        f"{', '.join(map(str, setting.bases))}; RL seeds {', '.join(map(str, setting.seeds))}; every run {setting.steps} steps "
        "of 8 prompts × 8 trajectories at lr 1e-4; the final validation 64 held-out prompts × 8 trajectories, rollout seed "
        "1000 + RL seed, the base validated with the same seed. Mean ± 95% t-interval over runs, the worst (lowest) run in "
        "brackets.\n",
        "## Machine and bases\n",
        *study4.study4_machine_lines(study, study4.Study4Setting("", (), setting.seeds, setting.steps)),
        *(
            f"- {e} base {b}: weights sha256 `{(sha or 'not made')[:16]}`"
            for e in ENVS
            for b in setting.bases
            for sha in [study4.weights_sha256(study.base_dir(b, e))]
        ),
        "",
        *blocks_line,
        f"\nPlanned runs not recorded: {', '.join(f'`{m}`' for m in missing) or 'none'}.\n",
    ]
    if any(by.get(variant(e, "grpo")) for e in ENVS):
        title = f"study 7: held-out, {setting.steps} steps"
        curves_plot(study, by, curves, title)
        behaviour_plot(by, behaviour, title)
        for env in ENVS:
            sections += [
                f"## {ENVS[env].title}: at the end\n",
                *table(by, env, ["base", *ARMS]),
                "",
                *table(by, env, list(ARMS), "base"),
                "",
                *table(by, env, list(ARMS)[1:], "grpo"),
                "",
            ]
        sections += [
            f"## Over training\n\n![curves]({curves.name})\n",
            f"## Tool calls, their diversity and pass@1\n\n![behaviour]({behaviour.name})\n",
            "## The hypotheses (pre-registered: study7.md, `HYPOTHESES`) and what was seen\n",
            "`+`/`−`: the 95% CI of the paired difference lies above/below 0; `=`: it contains 0 (study 3's rule). A part "
            "is MET when the sign seen is one the hypothesis allows, else a MISS; a hypothesis HELD when every part is MET. "
            "With 6 pairs t is 2.571; a `=` can be a lack of power.",
            *verdicts(by),
            "\n### Training seconds per step (two jobs at a time on 2 cores; not a criterion)\n",
            "| environment | method | runs | s/step (mean ± 95% CI) | fastest run |",
            "|---|---|---|---|---|",
            *(
                f"| {ENVS[e].title} | {NAMES[a]} | {len(sec)} | {study_stats.fmt(sec, 3)} | {min(sec):.3f} |"
                for e in ENVS
                for a in ARMS
                if (sec := study_stats.step_seconds(study.times(), variant(e, a), ("b0", "b1")))
            ),
        ]
    sections += study_runner.commands_section(study, "arm", lambda v: v in {variant(e, a) for e in ENVS for a in ARMS})
    study_runner.publish(sections, out)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return study_runner.study_parser(
        __doc__, "study7", "base 0 from 5-step warm starts, RL seed 0, 2 steps"
    ).parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    setting = SMOKE if args.smoke else STUDY7
    study = AgentStudy(
        args.work or study_runner.ROOT / "artifacts" / ("study7_smoke" if args.smoke else "study7"),
        setting,  # type: ignore[arg-type]
        args.slots,
        args.deadline,
    )
    if args.report_only:
        study4.claim_work(study.work, setting, None)
    else:
        t0 = time.perf_counter()
        run(study)
        study_runner.record_seconds(study.work, "study7 --smoke" if args.smoke else "study7", t0)
    where = study.work if args.smoke else study_runner.RESULTS
    write_report(study, where / "study7_results.md", where / "study7_curves.png", where / "study7_behaviour.png")


if __name__ == "__main__":
    main()
