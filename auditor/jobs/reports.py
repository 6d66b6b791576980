"""Jobs that read stored audit runs: the report, its HTML page, explain, the finance CSV."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from auditor.errors import InputError
from auditor.jobs.common import iso, one_cluster, open_store
from auditor.model import DEFAULT_CLUSTER, RunSlice, Window
from auditor.settings import Config, Thresholds

if TYPE_CHECKING:
    from collections.abc import Collection, Sequence

    import pandas as pd
    from sqlalchemy import Connection

    from auditor.classify.whatif import Policy
    from auditor.jobs.audit_chunks import Signals
    from auditor.report.explain import Explanation
    from auditor.report.render import Report
    from auditor.report.summary import GroupBy


def covering_runs(
    runs: pd.DataFrame, *, start_ms: int, end_ms: int, what: str, flags: bool = True
) -> list[int | RunSlice]:
    """The stored runs, or hours of runs (SPEC §11), that cover [start, end) exactly once
    for each cluster they are of; an error names what is missing (and of which cluster,
    where they are of several), or the whole hours to ask for instead (as `--start` and
    `--end` where `flags`, else as START..END)."""
    if "cluster" not in runs.columns or runs["cluster"].nunique() <= 1:
        return _covering(runs, start_ms=start_ms, end_ms=end_ms, what=what, flags=flags)
    parts: list[int | RunSlice] = []
    for name, mine in runs.groupby("cluster", sort=True):
        parts += _covering(
            mine,
            start_ms=start_ms,
            end_ms=end_ms,
            what=f"{what} of cluster {name}",
            flags=flags,
            cluster=str(name),
        )
    return parts


def _covering(
    runs: pd.DataFrame,
    *,
    start_ms: int,
    end_ms: int,
    what: str,
    flags: bool,
    cluster: str | None = None,
) -> list[int | RunSlice]:
    """`covering_runs` of runs of one cluster (named in the audit it asks for, if given)."""
    from auditor.report.windows import choose_slices

    named = "" if cluster is None else f" --cluster {cluster}"

    choice = choose_slices(runs, start_ms=start_ms, end_ms=end_ms)
    if choice.off_grid is not None:
        a, b = choice.off_grid
        hint = f"--start {iso(a)} --end {iso(b)}" if flags else f"{iso(a)}..{iso(b)}"
        raise InputError(
            f"{what} must start and end on whole UTC hours inside audited runs: try {hint}",
            field="window",
        )
    if choice.unsplit is not None:
        a, b = choice.unsplit
        raise InputError(
            f"{what} cuts the run of {iso(a)} to {iso(b)}, stored before results were kept "
            f"per hour: run `auditor audit{named} --start {iso(a)} --end {iso(b)}` again",
            field="window",
        )
    if choice.incomplete:
        a, b = choice.incomplete[0]
        raise InputError(
            f"{what} is not fully audited: the sharded run of {iso(a)} to {iso(b)} lacks "
            "shards; run the missing shards or an unsharded audit of that window",
            field="window",
        )
    if choice.missing:
        a, b = choice.missing[0]
        raise InputError(
            f"{what} is not fully audited: nothing covers {iso(a)} to {iso(b)}; "
            f"run `auditor audit{named} --start {iso(a)} --end {iso(b)}`",
            field="window",
        )
    return choice.parts


def build_report(
    url: str,
    *,
    start_ms: int | None,
    end_ms: int | None,
    by: GroupBy,
    team: str | None,
    top: int = 3,
    cluster: str | None = None,
) -> Report:
    """Read stored audit results for a window (default: the latest audited) into a Report:
    of `cluster` alone, or of every cluster audited where None (SPEC §11)."""
    engine = open_store(url)
    try:
        with engine.connect() as conn:
            report, _ = _read_report(
                conn, start_ms=start_ms, end_ms=end_ms, by=by, team=team, top=top, cluster=cluster
            )
    finally:
        engine.dispose()
    return report


def _read_report(
    conn: Connection,
    *,
    start_ms: int | None,
    end_ms: int | None,
    by: GroupBy,
    team: str | None,
    top: int,
    waits: bool = True,
    cluster: str | None = None,
) -> tuple[Report, pd.DataFrame]:
    """The Report of `build_report`, and the stored results it was made of (of `team` only,
    when given). `waits`: with the jobs' queue waits (the pods read once more)."""
    import pandas as pd

    from auditor.classify.queue import gang_half_starts
    from auditor.report.causes import cause_totals, complete_causes
    from auditor.report.compare import (
        outputs_by,
        outputs_by_name,
        outputs_in_window,
        sm_by,
        with_outputs,
    )
    from auditor.report.offenders import STRAGGLER_COLUMNS, stragglers, top_offenders
    from auditor.report.render import Report
    from auditor.report.summary import (
        GroupBy,
        group_keys,
        node_count,
        nodes_without_pods,
        summarise,
        totals,
        unjoined_cards,
        with_platform,
    )
    from auditor.report.waits import job_waits, longest_waits, with_waits
    from auditor.store import reads
    from auditor.store.demand import read_queue_waits
    from auditor.store.rollup import runs_rolled_up_seconds
    from auditor.store.signals import read_causes
    from auditor.store.work_done import read_outputs, read_sm

    per_output_groups = (GroupBy.JOB, GroupBy.TEAM)

    runs = reads.runs_in_window(conn, start_ms=start_ms, end_ms=end_ms, cluster=cluster)
    if runs.empty:
        of = "" if cluster is None else f" of cluster {cluster}"
        raise InputError(
            f"no audit results{of} for this window: run `auditor audit` first", field="window"
        )
    window = Window(  # without bounds, the latest audited window, whole
        int(runs["window_start_ms"].min()) if start_ms is None else start_ms,
        int(runs["window_end_ms"].max()) if end_ms is None else end_ms,
    )
    run_ids = covering_runs(runs, start_ms=window.start_ms, end_ms=window.end_ms, what="the window")
    results = reads.read_results(conn, run_ids)
    findings = reads.read_findings(conn, run_ids, window=window)
    rolled = runs_rolled_up_seconds(conn, run_ids)
    sm = read_sm(conn, run_ids)
    produced = read_outputs(conn, window=window) if by in per_output_groups else None
    scope = results if team is None else results[results["team"] == team]
    if team is not None and scope.empty:
        raise InputError(f"no team {team!r} in this window", field="--team")
    # the stored causes completed with what they leave as the no-signal cause, once for the
    # rows, the totals and the offenders (the team's rows: what summarise keeps of results)
    split = complete_causes(with_platform(scope), read_causes(conn, run_ids))
    rows = summarise(results, by=by, team=team, split=split)
    # a job of one name in two clusters is two jobs (SPEC §11): its waits and stragglers too
    clustered = "cluster" in group_keys(GroupBy.JOB, results)
    queue = job_waits(pd.DataFrame(), pd.DataFrame(), pd.DataFrame(), by_cluster=clustered)
    if waits:  # queue waste and half-starts, from the pods (SPEC §10)
        every_pod = reads.read_pods(conn, cluster=cluster)
        bound = _bound_in(every_pod, window)
        # a gang is named inside its cluster (a PodGroup's name): each cluster's apart
        halves = [gang_half_starts(p).assign(cluster=c) for c, p in bound.groupby("cluster")]
        queue = job_waits(
            read_queue_waits(conn, window=window, cluster=cluster),
            pd.concat(halves, ignore_index=True) if halves else gang_half_starts(bound),
            every_pod,
            by_cluster=clustered,
        )
    if team is not None:
        queue = queue[queue["team"] == team]
    if by is GroupBy.JOB:
        on = ["cluster", "namespace", "job"] if clustered else ["namespace", "job"]
        slow = stragglers(findings, by_cluster=clustered)[[*on, *STRAGGLER_COLUMNS]]
        rows = rows.merge(slow, on=on, how="left")
        no_wait = rows["straggler_wait_gpu_hours"] <= 0
        rows.loc[no_wait, STRAGGLER_COLUMNS] = None
        rows = with_waits(rows, queue)
    if by is GroupBy.GPU:  # which metric each card's utilisation came from
        # a physical card's row: its own source, else its MIG instances'
        on_card = results.assign(gpu=results["card"]) if "card" in results else results
        source = on_card.sort_values("util_source", na_position="last", kind="stable")[
            ["gpu", "util_source"]
        ].drop_duplicates("gpu")
        rows = rows.merge(source, on="gpu", how="left")
        rows.insert(list(rows.columns).index("gpu") + 1, "util_source", rows.pop("util_source"))
    keys = group_keys(by, results)
    rows = sm_by(sm if team is None else sm[sm["team"] == team], rows, keys)
    if produced is not None:
        mine = produced if team is None else produced[produced["team"] == team]
        counted = outputs_in_window(mine, window=window)
        per_group = (
            outputs_by_name(rows, counted, keys)
            if "cluster" in keys and "cluster" not in counted.columns
            else outputs_by(counted, keys)
        )
        rows = with_outputs(rows, per_group, keys)
    cards = scope[["gpu", "util_source"]].drop_duplicates("gpu")["util_source"].dropna()
    report = Report(
        window=window,
        by=by.value,
        rows=rows,
        totals=totals(scope),
        causes=cause_totals(split),
        offenders=top_offenders(scope, findings, top=top, split=split),
        rolled_up_seconds=rolled,
        util_sources={str(k): int(v) for k, v in cards.value_counts().items()},
        nodes=node_count(scope),
        nodes_without_pods=nodes_without_pods(scope),
        unjoined_cards=unjoined_cards(scope),
        waited=longest_waits(queue),
    )
    return report, scope


def _bound_in(pods: pd.DataFrame, window: Window) -> pd.DataFrame:
    """The pods bound inside `window`: a gang's half-start is its window's whose last pod
    was bound in it."""
    import pandas as pd

    bound = pd.to_numeric(pods["bound_ms"], errors="coerce")
    gangs = set(pods.loc[(bound >= window.start_ms) & (bound < window.end_ms), "gang"])
    return pods[pods["gang"].isin(gangs)]


@dataclass(frozen=True)
class _Holdings:
    """Who held which card when, read once for any number of explanations."""

    pods: pd.DataFrame
    gpus: pd.DataFrame
    tenures: pd.DataFrame


def _read_holdings(
    conn: Connection,
    *,
    target: str | None = None,
    cluster: str = DEFAULT_CLUSTER,
    pods: pd.DataFrame | None = None,
) -> _Holdings:
    """Every pod and card of `cluster`, and the tenures of every pod, or with `target` only
    of the pods on the nodes its gangs ran on (all that explaining it needs: its gangs'
    cards and their other tenants). `pods`: the cluster's, where already read."""
    from auditor.report.targets import resolve_target
    from auditor.store import reads
    from auditor.store.placement import held_tenures
    from auditor.store.rollup import rollup_span

    span = reads.sample_span(conn, cluster=cluster) or rollup_span(conn, cluster=cluster)
    now_ms = span[1] if span else int(time.time() * 1000)
    window = (span[0], now_ms) if span else (now_ms, now_ms)
    on_nodes = None
    if target is not None:
        if pods is None:
            pods = reads.read_pods(conn, cluster=cluster)
        _, uids = resolve_target(pods, target)
        gang = pods["gang"].fillna(pods["uid"])
        mates = gang.isin(set(gang[pods["uid"].isin(uids)]))
        on_nodes = set(pods.loc[mates, "node"].dropna().astype(str))
    pods, gpus, tenures = held_tenures(
        conn, now_ms=now_ms, window=window, on_nodes=on_nodes, cluster=cluster, pods=pods
    )
    return _Holdings(pods, gpus, tenures)


def target_cluster(pods: pd.DataFrame, target: str) -> str:
    """The cluster a job or pod of `pods` (every cluster's) runs in: an error naming them
    where a name is in several (SPEC §11: explain it with `--cluster`), or where none has
    it."""
    from auditor.report.targets import resolve_target

    _, uids = resolve_target(pods, target)
    found = sorted(set(pods.loc[pods["uid"].isin(uids), "cluster"].astype(str)))
    return one_cluster(found, what=repr(target))


def explain(
    url: str,
    target: str,
    *,
    thresholds: Thresholds,
    buckets: int = 600,
    cluster: str | None = None,
) -> Explanation:
    """Each card of a job or pod over its whole tenure: timeline, findings, next steps.

    Classifies the target's gang(s) afresh from the stored samples (no audit run needed), so
    the totals are the classifier's for exactly the span the target held its cards, and the
    timelines are drawn from the same classification's pieces. `cluster`: the cluster it
    runs in (None: the one whose pods have its name)."""
    from auditor.store import reads

    engine = open_store(url)
    try:
        with engine.connect() as conn:
            if cluster is None:  # every pod is read once: to find the cluster, then to place
                everyone = reads.read_pods(conn)
                of = target_cluster(everyone, target)
                pods = everyone[everyone["cluster"] == of].reset_index(drop=True)
            else:
                of, pods = cluster, reads.read_pods(conn, cluster=cluster)
            held = _read_holdings(conn, target=target, cluster=of, pods=pods)
            return _explain(conn, held, target, thresholds=thresholds, buckets=buckets)
    finally:
        engine.dispose()


def _explain(
    conn: Connection, held: _Holdings, target: str, *, thresholds: Thresholds, buckets: int
) -> Explanation:
    import pandas as pd

    from auditor.classify.arrays import run_isin
    from auditor.classify.causes import multi_card_pods, split_compute_idle
    from auditor.classify.pipeline import classify
    from auditor.classify.rollup import with_rolled
    from auditor.jobs.audit_chunks import NEIGHBOUR_SAMPLES
    from auditor.jobs.parts import READ_MARGIN_MS
    from auditor.report.explain import build_explanation
    from auditor.report.targets import resolve_target
    from auditor.report.timeline import bucketise
    from auditor.store import reads

    label, uids = resolve_target(held.pods, target)
    tenures = held.tenures
    mine = tenures[tenures["pod_uid"].isin(uids)]
    if mine.empty:
        raise InputError(
            f"{label} held no GPU: no pod of it was bound to a node", field="JOB_OR_POD"
        )
    gang = tenures[tenures["gang"].isin(set(mine["gang"]))]
    g_lo, g_hi = int(gang["start_ms"].min()), int(gang["end_ms"].max())
    cards = set(gang["gpu"])
    ids = [int(i) for i, u in zip(held.gpus["id"], held.gpus["uuid"], strict=True) if u in cards]
    uuid_of = {int(i): str(u) for i, u in zip(held.gpus["id"], held.gpus["uuid"], strict=True)}
    wanted = [(i, g_lo, g_hi) for i in ids]
    # The target's tenures hold every piece of its cards: their results for this window are
    # their results for the explained span [lo, hi) below, and the gang's findings are clipped
    # to when the target held cards.
    held_span = Window(int(mine["start_ms"].min()), int(mine["end_ms"].max()))
    margin = round(thresholds.signal_stale_s * 1000) + READ_MARGIN_MS

    # read as the audit reads a card (its hot path, and the same neighbours at the edges)
    raw = reads.read_card_samples(conn, wanted, uuid_of, neighbours=NEIGHBOUR_SAMPLES)
    rolled, activity, signals = _read_beside_samples(
        conn, wanted, uuid_of, uids=uids, span=held_span, margin=margin
    )
    samples = with_rolled(raw, rolled)
    # the other tenants of a shared card decide the target's part of it (SPEC §7)
    on_cards = tenures[tenures["gpu"].isin(cards) & ~tenures.index.isin(gang.index)]
    context = pd.concat([gang, on_cards]) if len(on_cards) else gang
    found = classify(
        samples,
        context,
        window=held_span,
        thresholds=thresholds,
        keep_pieces=True,
        cards=held.gpus,
        activity=activity,
    )
    assert found.pieces is not None
    theirs = run_isin(found.pieces["pod_uid"], uids)
    pieces = found.pieces if bool(theirs.all()) else found.pieces[theirs]
    if pieces.empty:
        raise InputError(f"no GPU samples of {label}'s cards", field="JOB_OR_POD")
    lo, hi = int(pieces["start_ms"].min()), int(pieces["end_ms"].max())
    # why the target's cards idled (SPEC §10): its pods' and cards' signals over its span
    idle = split_compute_idle(
        pieces,
        pod_signals=signals.pods,
        card_signals=signals.cards,
        multi_card_pods=multi_card_pods(gang),
        thresholds=thresholds.causes,
    )
    return build_explanation(
        idle=idle,
        target=label,
        window=Window(lo, hi),
        timelines=bucketise(pieces, span=Window(lo, hi), buckets=buckets),
        results=found.results,
        findings=found.findings[
            found.findings["gang"].isin(set(gang["gang"])) | found.findings["pod_uid"].isin(uids)
        ],
        pods=held.pods,
        gpus=held.gpus,
    )


def _read_beside_samples(
    conn: Connection,
    wanted: list[tuple[int, int, int]],
    uuid_of: dict[int, str],
    *,
    uids: Collection[str],
    span: Window,
    margin: int,
) -> tuple[pd.DataFrame, pd.DataFrame, Signals]:
    """What `explain` reads beside the samples of the cards `wanted`: their rolled-up
    minutes, their tenants' own utilisation, and the signals of the pods `uids` and of the
    cards over `span` (and `margin` either side).

    Read in this process, after the samples: a forked reader beside them cost more than it
    saved, since every page of this process's heap the classification then wrote took a
    copy-on-write fault."""
    from auditor.jobs.audit_chunks import Signals
    from auditor.store import reads
    from auditor.store.rollup import read_rolled_card_samples
    from auditor.store.signals import read_card_signals, read_pod_signals

    cards = {i: uuid_of[i] for i, _, _ in wanted}
    return (
        read_rolled_card_samples(conn, wanted),
        reads.read_tenant_util(conn, wanted, uuid_of),
        Signals(
            pods=read_pod_signals(conn, sorted(uids), window=span, margin_ms=margin),
            cards=read_card_signals(conn, window=span, margin_ms=margin, cards=cards),
        ),
    )


def build_report_html(
    url: str,
    *,
    start_ms: int | None,
    end_ms: int | None,
    by: GroupBy,
    team: str | None,
    thresholds: Thresholds,
    timelines: int = 8,
    policies: Sequence[Policy] = (),
    cluster: str | None = None,
) -> str:
    """The report as one HTML page, with the per-card utilisation and the timelines of the
    `timelines` jobs that lead the offenders table, and with `policies` the idle policies
    replayed over the report's window. One connection reads everything: the report, and who
    held which card once for all the timelines."""
    from auditor.jobs.whatif import replay_stored
    from auditor.report.html import render_report_html
    from auditor.report.summary import held_cards_utilisation

    engine = open_store(url)
    try:
        with engine.connect() as conn:
            # the page reads the pods once, for the timelines; it shows no queue waits
            report, results = _read_report(
                conn,
                start_ms=start_ms,
                end_ms=end_ms,
                by=by,
                team=team,
                top=3,
                waits=False,
                cluster=cluster,
            )
            off = report.offenders.sort_values("gpu_hours", ascending=False, kind="stable")
            offenders = [
                str(o)
                for o, t in zip(off["offender"], off["team"], strict=True)
                if isinstance(t, str) and str(o).count("/") == 2
            ]
            shown: list[Explanation] = []
            # who held what, once per cluster the report is of: an offender's timeline is
            # drawn from the first cluster that has its pods
            helds = (
                [_read_holdings(conn, cluster=c) for c in sorted(set(results["cluster"]))]
                if offenders
                else []
            )
            for target in dict.fromkeys(offenders):
                if not helds or len(shown) >= timelines:
                    break
                for held in helds:
                    try:
                        shown.append(
                            _explain(conn, held, target, thresholds=thresholds, buckets=200)
                        )
                        break
                    except InputError:
                        continue  # pods gone from the store, or another cluster's job
            if policies and results["cluster"].nunique() > 1:
                raise InputError(
                    "--policy replays one cluster: add --cluster NAME", field="--policy"
                )
            replayed = (
                replay_stored(
                    conn,
                    policies=policies,
                    window=report.window,
                    thresholds=thresholds,
                    cluster=str(results["cluster"].iloc[0]) if len(results) else DEFAULT_CLUSTER,
                )
                if policies
                else None
            )
    finally:
        engine.dispose()
    util = held_cards_utilisation(results)["util_pct"].tolist()
    return render_report_html(report, card_util=util, timelines=shown, whatif=replayed)


def export_finance(
    url: str,
    *,
    week: str,
    config: Config,
    warn: Callable[[str], None] | None = None,
    cluster: str | None = None,
) -> str:
    """The finance CSV of one ISO week, from the stored audit runs that cover it exactly
    (of `cluster`, or of every cluster audited; each row names its cluster). `warn` hears of
    GPU models without a price (their cost columns are 0.00)."""
    from auditor.report.finance import (
        finance_rows,
        parse_week,
        render_finance_csv,
        unpriced_note,
    )
    from auditor.store import reads
    from auditor.store.signals import read_causes

    wk = parse_week(week)
    engine = open_store(url)
    with engine.connect() as conn:
        runs = reads.runs_in_window(conn, start_ms=wk.start_ms, end_ms=wk.end_ms, cluster=cluster)
        run_ids = covering_runs(
            runs, start_ms=wk.start_ms, end_ms=wk.end_ms, what=f"week {wk.label}"
        )
        results = reads.read_results(conn, run_ids)
        causes = read_causes(conn, run_ids)
    rows = finance_rows(
        results,
        week=wk,
        prices=config.prices,
        cost_centres=config.cost_centres,
        causes=causes,
    )
    note = unpriced_note(rows, prices=config.prices)
    if note is not None and warn is not None:
        warn(note)
    return render_finance_csv(rows)
