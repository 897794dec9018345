"""The numerics view's plumbing in verl's own data shapes, without a trainer start (the demo's trainer runs in
tests/demo/): each row's rollout id, turn starts and prompt length read from the batch as verl's v1 (TransferQueue)
and v0 trainers build it and as their FSDP ranks receive it; the summaries equal numcore's ``summarize_rollout`` on
the unpadded rows; the collector keeps one summary per rollout and counts what was expected and not measured; and
the policy loss of verl's registry measures on the micro-batches the driver switched on, before the step's first
update only, then delegates."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
import torch

from verl_ext.core.numerics import NumericsOptions, summarize_rollout
from verl_ext.plugin import numerics_loss, numerics_sink
from verl_ext.plugin.numerics_rows import prompt_lengths, row_keys, rows_of, summarize_rows
from verl_ext.plugin.numerics_trainer import ANNOUNCE_KEY, NumericsSettings

OPTIONS = NumericsOptions(depth_edges=(0, 8, 16), drift_mean_abs_delta=0.05, token_abs_delta=0.5)


def make_rows(rng: random.Random, n: int) -> list[dict[str, Any]]:
    """Rollouts of 1-3 engine calls: prompt, then per call a context gap (mask 0; none before the first) and its
    sampled tokens (mask 1); engine logprobs and trainer logprobs a small Δ apart, one row drifting."""
    rows = []
    for k in range(n):
        prompt = rng.randint(2, 12)
        mask: list[int] = []
        starts = []
        for call in range(rng.randint(1, 3)):
            if call:
                mask += [0] * rng.randint(1, 4)
            starts.append(len(mask))
            mask += [1] * rng.randint(1, 6)
        f32 = np.float32  # verl holds logprobs as float32: the rows are float32 values, so both sides read the same
        engine = [float(f32(-rng.random() * 3)) for _ in mask]
        shift = 0.3 if k == 0 else 1e-6
        trainer = [float(f32(e + (shift * rng.random() if m else 5.0))) for e, m in zip(engine, mask, strict=True)]
        rows.append(
            {
                "id": f"r{k}",
                "prompt": prompt,
                "starts": starts,
                "mask": mask,
                "engine": engine,
                "trainer": trainer,
                "engine_ok": True,  # the check's verdict the loop put beside the rollout (verl_ext_check)
            }
        )
    return rows


def v1_batch(rows: list[dict[str, Any]]) -> Any:
    """The batch as verl's v1 agent loop puts it into TransferQueue (AgentLoopOutput.as_dict, one row each)."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    fields = []
    for r in rows:
        out = AgentLoopOutput(
            prompt_ids=list(range(r["prompt"])),
            response_ids=list(range(len(r["mask"]))),
            response_mask=r["mask"],
            response_logprobs=r["engine"],
            num_turns=2,
            metrics={},
            extra_fields={
                "verl_ext_rollout_id": r["id"],
                "verl_ext_turn_starts": r["starts"],
                "verl_ext_check": {"ok": r["engine_ok"], "engine_ok": r["engine_ok"]},
            },
        )
        field = out.as_dict()
        field["old_log_probs"] = torch.tensor(r["trainer"])
        fields.append(field)
    return list_of_dict_to_tensordict(fields)


def v0_batch(rows: list[dict[str, Any]]) -> Any:
    """The batch as verl's v0 trainer holds it: prompts left-padded, responses right-padded, one non-tensor column
    per extra field."""
    from verl import DataProto

    p, r = max(x["prompt"] for x in rows), max(len(x["mask"]) for x in rows)
    prompts = torch.zeros(len(rows), p, dtype=torch.long)
    attention = torch.zeros(len(rows), p + r, dtype=torch.long)
    mask, engine, trainer = (torch.zeros(len(rows), r) for _ in range(3))
    for i, x in enumerate(rows):
        n = len(x["mask"])
        attention[i, p - x["prompt"] : p + n] = 1
        mask[i, :n] = torch.tensor(x["mask"], dtype=torch.float)
        engine[i, :n], trainer[i, :n] = torch.tensor(x["engine"]), torch.tensor(x["trainer"])
    batch = DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "attention_mask": attention,
            "input_ids": torch.zeros(len(rows), p + r, dtype=torch.long),
            "position_ids": torch.arange(p + r).repeat(len(rows), 1),
            "response_mask": mask.long(),
            "rollout_log_probs": engine,
        },
        non_tensors={
            "verl_ext_rollout_id": np.array([x["id"] for x in rows], dtype=object),
            "verl_ext_turn_starts": np.array([x["starts"] for x in rows] + [None], dtype=object)[:-1],
            "verl_ext_check": np.array([{"engine_ok": x["engine_ok"]} for x in rows], dtype=object),
        },
    )
    return batch, trainer


def expected(rows: list[dict[str, Any]], source: str, step: int = 3) -> dict[str, Any]:
    """numcore's summaries of the unpadded rows: what the hooks must hand on."""
    return {
        r["id"]: summarize_rollout(
            r["id"], r["trainer"], r["engine"], r["mask"], r["prompt"], r["starts"], OPTIONS, source, step
        )
        for r in rows
    }


@pytest.mark.parametrize("seed", range(6))
def test_v1_batches_give_each_rollouts_keys_and_its_unpadded_summary(seed: int) -> None:
    rows = make_rows(random.Random(seed), 5)
    td = v1_batch(rows)
    keys = row_keys(td, prompt_lengths(td))
    assert keys is not None
    assert keys.rollout_ids == [r["id"] for r in rows] and keys.turn_starts == [r["starts"] for r in rows]
    assert keys.prompt_lengths == [r["prompt"] for r in rows]
    out = summarize_rows(
        keys, rows_of(td["old_log_probs"]), rows_of(td["rollout_log_probs"]), rows_of(td["response_mask"]), OPTIONS,
        "old_log_prob", 3,
    )  # fmt: skip
    assert {n.rollout_id: n for n in out.measured} == expected(rows, "old_log_prob")
    assert out.drifting_rows == [0]  # the one row shifted by up to 0.3 nats


@pytest.mark.parametrize("seed", range(6))
def test_v0_batches_and_what_their_ranks_receive_give_the_same_keys(seed: int) -> None:
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    rows = make_rows(random.Random(seed), 4)
    batch, trainer = v0_batch(rows)
    keys = row_keys(batch, prompt_lengths(batch))
    assert keys is not None and keys.prompt_lengths == [r["prompt"] for r in rows]
    out = summarize_rows(
        keys, rows_of(trainer), rows_of(batch.batch["rollout_log_probs"]), rows_of(batch.batch["response_mask"]),
        OPTIONS, "old_log_prob", 3,
    )  # fmt: skip
    # padding past a row's response (mask 0) changes nothing: the same summaries as on the unpadded rows
    assert {n.rollout_id: n for n in out.measured} == expected(rows, "old_log_prob")
    # what an FSDP rank's loss gets: verl's own conversion, then its micro-batches (one row each here)
    batch.meta_info[ANNOUNCE_KEY] = NumericsSettings(OPTIONS).announcement(3)
    td = left_right_2_no_padding(batch.to_tensordict())
    for i, micro in enumerate(tu.chunk_tensordict(td, len(rows))):
        k = row_keys(micro, prompt_lengths(micro))
        assert k is not None and k.rollout_ids == [rows[i]["id"]] and k.turn_starts == [rows[i]["starts"]]
        assert k.prompt_lengths == [rows[i]["prompt"]]
        assert numerics_loss.announcement(micro)["step"] == 3


def test_rows_without_an_id_or_turn_starts_are_unavailable_not_dropped() -> None:
    rows = make_rows(random.Random(0), 3)
    td = v1_batch(rows)
    keys = row_keys(td, prompt_lengths(td))
    assert keys is not None
    keys.rollout_ids[1] = None  # a row from a loop that is not verl_ext's
    keys.turn_starts[2] = None
    out = summarize_rows(
        keys, rows_of(td["old_log_probs"]), rows_of(td["rollout_log_probs"]), rows_of(td["response_mask"]), OPTIONS,
        "old_log_prob", 3, skip=[True, False, False],
    )  # fmt: skip
    assert not out.measured and out.unavailable == ["r2"] and out.unavailable_without_id == 1
    assert out.reasons == {"no_rollout_id": 1, "no_turn_starts": 1}


def test_the_collector_keeps_one_summary_per_rollout_and_counts_the_missing() -> None:
    rows = make_rows(random.Random(1), 3)
    sums = expected(rows, "bypass_loss")
    c = numerics_sink.NumericsCollector()
    c.add(expected=["r0", "r1", "r2", "r3"])
    c.add(measured=[sums["r0"], sums["r1"]])
    c.add(measured=[sums["r0"]])  # the same micro-batch on another rank
    c.add(unavailable=["r2"], unavailable_without_id=2)
    batch = c.take()
    assert set(batch.measured) == {"r0", "r1"} and batch.unavailable_count == 2 + 2  # r2, r3 and two without id
    assert not c.take()  # taken means forgotten
    c.add(measured=[sums["r2"]], unavailable=["r2"])  # measured before the update, seen again after it
    assert c.take().unavailable_count == 0


@pytest.fixture
def actor_config() -> Any:
    from loop_harness import verl_config
    from verl.utils.config import omega_conf_to_dataclass

    return omega_conf_to_dataclass(
        verl_config(["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1"]).actor_rollout_ref.actor
    )


def micro_batch(rows: list[dict[str, Any]], step: int | None, strict: bool = False) -> Any:
    """A v1 micro-batch as a rank's loss gets it, switched on for ``step`` by the driver (None: not switched)."""
    from verl.utils import tensordict_utils as tu

    td = v1_batch(rows)
    if step is not None:
        tu.assign_non_tensor(td, **{ANNOUNCE_KEY: NumericsSettings(OPTIONS, strict=strict).announcement(step)})
    return td


def padded(rows: list[dict[str, Any]], key: str) -> torch.Tensor:
    n = max(len(r["mask"]) for r in rows)
    return torch.tensor([r[key] + [0] * (n - len(r[key])) for r in rows], dtype=torch.float)


def call_loss(actor_config: Any, rows: list[dict[str, Any]], data: Any) -> Any:
    """verl's registered vanilla loss, as ppo_loss calls it: by name, keywords, with the micro-batch in scope."""
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    seen: dict[str, Any] = {}
    loss_fn = get_policy_loss_fn("vanilla")
    with numerics_loss.micro_batch_in_scope(data):
        out = loss_fn(
            old_log_prob=padded(rows, "engine"),
            log_prob=padded(rows, "trainer"),
            advantages=torch.ones(len(rows), padded(rows, "mask").shape[1]),
            response_mask=padded(rows, "mask").bool(),
            loss_agg_mode="token-mean",
            config=actor_config,
        )
    seen["loss"] = out[0]
    return seen


def test_the_registry_loss_measures_before_the_steps_first_update_only(actor_config: Any) -> None:
    rows = make_rows(random.Random(2), 3)
    numerics_sink.drain()
    numerics_loss._updated_step[0] = None
    plain = call_loss(actor_config, rows, micro_batch(rows, None))["loss"]  # no switch: the loss only delegates
    assert not numerics_sink.drain()
    assert call_loss(actor_config, rows, micro_batch(rows, 7))["loss"] == plain  # measuring changes no number
    batch = numerics_sink.drain()
    assert batch.measured == expected(rows, "bypass_loss", step=7)
    numerics_loss._updated_step[0] = 7  # the step's first optimizer update ran on this rank
    call_loss(actor_config, rows, micro_batch(rows, 7))
    after = numerics_sink.drain()
    assert not after.measured and after.unavailable == {"r0", "r1", "r2"}
    call_loss(actor_config, rows, micro_batch(rows, 8))  # the next step measures again
    assert len(numerics_sink.drain().measured) == 3


def test_strict_bypass_masks_the_drifting_rollout_in_the_loss(actor_config: Any) -> None:
    rows = make_rows(random.Random(3), 3)
    numerics_loss._updated_step[0] = None
    numerics_sink.drain()
    warn = call_loss(actor_config, rows, micro_batch(rows, 1))["loss"]
    strict = call_loss(actor_config, rows, micro_batch(rows, 2, strict=True))["loss"]
    without = call_loss(actor_config, rows[1:], micro_batch(rows[1:], None))["loss"]
    assert numerics_sink.drain().masked == {"r0"}
    assert torch.isclose(strict, without) and not torch.isclose(strict, warn)  # row 0 drifts: out of the loss


def v0_trainer(strict: bool, extra: tuple[str, ...] = ()) -> Any:
    """What measure_v0 reads of verl's RayPPOTrainer: its composed config and step (``strict``: the numerics
    policy; ``extra``: more overrides)."""
    from types import SimpleNamespace

    from loop_harness import verl_config

    from verl_ext.plugin import numerics_trainer

    numerics_trainer._settings = None  # read once per process: each test its own
    extra = (*extra, "+verl_ext.numerics.policy=strict") if strict else extra
    overrides = [*extra, "+verl_ext.numerics.drift_mean_abs_delta=0.05", "+verl_ext.numerics.depth_edges=[0,8,16]"]
    return SimpleNamespace(config=verl_config(overrides), global_steps=4)


@pytest.mark.parametrize("strict", [False, True])
def test_v0_strict_masks_the_drifting_rollout_before_advantages(strict: bool) -> None:
    from verl import DataProto

    from verl_ext.plugin.numerics_trainer import measure_v0

    rows = make_rows(random.Random(4), 4)  # row 0 drifts
    batch, trainer = v0_batch(rows)
    before = batch.batch["response_mask"].clone()
    numerics_sink.drain()
    measure_v0(v0_trainer(strict), batch, DataProto.from_dict(tensors={"old_log_probs": trainer}))
    got = numerics_sink.drain()
    assert got.measured == expected(rows, "old_log_prob", step=4) and got.unavailable_count == 0
    after = batch.batch["response_mask"]
    assert torch.equal(after[1:], before[1:])
    assert (after[0].sum() == 0) == strict and got.masked == ({"r0"} if strict else set())


@pytest.mark.parametrize("verdict", ["tokens not the engine's", "no check verdict", "check strict, numerics warn"])
def test_strict_masks_only_where_the_two_part_verdict_compares_numbers(verdict: str) -> None:
    from verl import DataProto

    from verl_ext.plugin.numerics_trainer import measure_v0

    rows = make_rows(random.Random(4), 4)  # row 0 drifts
    strict, extra = True, ()
    if verdict == "tokens not the engine's":
        rows[0]["engine_ok"] = False  # the check found the trainer's tokens are not the engine's: numbers not compared
    elif verdict == "check strict, numerics warn":
        strict, extra = False, ("+verl_ext.check.mode=strict",)  # the check's strict mode is not the numbers' policy
    batch, trainer = v0_batch(rows)
    if verdict == "no check verdict":
        del batch.non_tensor_batch["verl_ext_check"]  # rows from a batch that carries no check verdict
    before = batch.batch["response_mask"].clone()
    numerics_sink.drain()
    measure_v0(v0_trainer(strict, extra), batch, DataProto.from_dict(tensors={"old_log_probs": trainer}))
    got = numerics_sink.drain()
    assert got.measured == expected(rows, "old_log_prob", step=4)  # measured and reported all the same
    assert got.measured["r0"].verdict(OPTIONS).status == "drift"
    assert torch.equal(batch.batch["response_mask"], before) and not got.masked


def test_strict_bypass_masks_only_rollouts_whose_tokens_are_the_engines(actor_config: Any) -> None:
    rows = make_rows(random.Random(3), 3)
    rows[0]["engine_ok"] = False  # row 0 drifts, but its numbers are not compared
    numerics_loss._updated_step[0] = None
    numerics_sink.drain()
    warn = call_loss(actor_config, rows, micro_batch(rows, 1))["loss"]
    strict = call_loss(actor_config, rows, micro_batch(rows, 2, strict=True))["loss"]
    assert not numerics_sink.drain().masked and torch.isclose(strict, warn)


def test_strict_refuses_a_batch_whose_every_rollout_drifts() -> None:
    from verl import DataProto

    from verl_ext.plugin.numerics_trainer import NumericsStrictError, measure_v0

    rows = make_rows(random.Random(5), 3)
    for r in rows:
        r["trainer"] = [t + 0.2 for t in r["trainer"]]
    batch, trainer = v0_batch(rows)
    with pytest.raises(NumericsStrictError, match="every one of step 4's 3 rollouts drifts.*drift_mean_abs_delta"):
        measure_v0(v0_trainer(True), batch, DataProto.from_dict(tensors={"old_log_probs": trainer}))
    numerics_sink.drain()


def test_each_step_writes_a_numerics_line_per_rollout_and_is_never_silently_absent(tmp_path: Any) -> None:
    """The driver's step hook: measured rollouts become numerics record lines (read back by the record reader)
    and tito/numerics/ metrics; a training step whose checked rollouts got no number counts them unavailable."""
    from verl_ext.plugin import numerics_step, numerics_trainer
    from verl_ext.telemetry.records import read_record_files

    rows = make_rows(random.Random(6), 3)
    numerics_sink.drain()
    numerics_step._WRITERS.clear()
    numerics_trainer._settings = NumericsSettings(OPTIONS, records_dir=str(tmp_path))
    numerics_sink.report(expected(rows, "old_log_prob").values(), expected=["r0", "r1", "r2", "r9"])
    m = numerics_step.step_metrics(3, checked=4.0)
    assert m["tito/numerics/rollouts"] == 3 and m["tito/numerics/numerics_unavailable"] == 1  # r9: no number
    assert m["tito/numerics/drift_rollouts"] == 1
    lines = read_record_files(sorted(tmp_path.glob("numerics-*.jsonl"))).numerics
    assert sorted(line.rollout_id for line in lines) == ["r0", "r1", "r2"]
    # nothing reached the collector in a step whose 4 rollouts were checked: all 4 unavailable, not absent
    m = numerics_step.step_metrics(4, checked=4.0)
    assert m["tito/numerics/rollouts"] == 0 and m["tito/numerics/numerics_unavailable"] == 4
    assert numerics_step.step_metrics(5, checked=0.0) == {}  # a validation log: no trainer numbers by design
    numerics_trainer._settings = None
    numerics_step._WRITERS.clear()


def ppo_loss_inputs(rows: list[dict[str, Any]], step: int | None, strict: bool = False) -> tuple[Any, Any]:
    """What an FSDP rank's engine hands verl's ``ppo_loss`` in bypass mode: the micro-batch (old logprobs are the
    engine's) and the model output over whole sequences (logprobs and entropy, nested as the no-padding engine
    gives them; a response token's logprob sits one position before it)."""
    from verl.utils import tensordict_utils as tu

    td = micro_batch(rows, step, strict)
    td["old_log_probs"] = torch.nested.as_nested_tensor([torch.tensor(r["engine"]) for r in rows], layout=torch.jagged)
    td["advantages"] = torch.nested.as_nested_tensor([torch.ones(len(r["mask"])) for r in rows], layout=torch.jagged)
    ref = [torch.tensor(r["engine"]) - 0.01 * (r["prompt"] + len(r["mask"])) for r in rows]
    td["ref_log_prob"] = torch.nested.as_nested_tensor(ref, layout=torch.jagged)
    tu.assign_non_tensor(td, dp_size=1, batch_num_tokens=None, global_batch_size=None)
    seqs = []
    for r in rows:
        seq = torch.zeros(r["prompt"] + len(r["mask"]))
        seq[r["prompt"] - 1 : r["prompt"] - 1 + len(r["mask"])] = torch.tensor(r["trainer"])
        seqs.append(seq)
    log_probs = torch.nested.as_nested_tensor(seqs, layout=torch.jagged)
    entropy = torch.nested.as_nested_tensor(
        [torch.full_like(s, 2.0 + 0.1 * (r["prompt"] + len(r["mask"]))) for r, s in zip(rows, seqs, strict=True)],
        layout=torch.jagged,
    )
    return td, {"log_probs": log_probs, "entropy": entropy}


@pytest.fixture
def wrapped_ppo_loss() -> Any:
    from verl.workers.utils import losses

    numerics_loss.install_micro_batch_channel(losses)  # idempotent: the plugin may have installed it already
    numerics_loss._updated_step[0] = None
    numerics_sink.drain()
    yield losses.ppo_loss
    numerics_sink.drain()


@pytest.fixture
def entropy_kl_config() -> Any:
    """An actor whose loss has all three terms ppo_loss builds: policy, entropy and KL to the reference."""
    from loop_harness import verl_config
    from verl.utils.config import omega_conf_to_dataclass

    overrides = ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1", "actor_rollout_ref.actor.entropy_coeff=0.5"]
    overrides.append("actor_rollout_ref.actor.use_kl_loss=true")
    return omega_conf_to_dataclass(verl_config(overrides).actor_rollout_ref.actor)


def test_strict_bypass_takes_the_drifting_rollout_out_of_every_term_of_ppo_loss(
    entropy_kl_config: Any, wrapped_ppo_loss: Any
) -> None:
    actor_config = entropy_kl_config
    rows = make_rows(random.Random(3), 3)  # row 0 drifts
    strict, _ = wrapped_ppo_loss(actor_config, *reversed(ppo_loss_inputs(rows, 2, strict=True)))
    assert numerics_sink.drain().masked == {"r0"}
    # the same loss over the other rows alone: policy and entropy terms both without row 0
    without, _ = wrapped_ppo_loss(actor_config, *reversed(ppo_loss_inputs(rows[1:], None)))
    warn, _ = wrapped_ppo_loss(actor_config, *reversed(ppo_loss_inputs(rows, 1)))
    assert torch.isclose(strict, without) and not torch.isclose(strict, warn)


def test_strict_bypass_refuses_a_micro_batch_whose_every_rollout_drifts(
    actor_config: Any, wrapped_ppo_loss: Any
) -> None:
    from verl_ext.plugin.numerics_trainer import NumericsStrictError

    rows = make_rows(random.Random(5), 3)
    for r in rows:
        r["trainer"] = [t + 0.2 for t in r["trainer"]]
    with pytest.raises(NumericsStrictError, match="every one of step 2's 3 rollouts drifts.*drift_mean_abs_delta"):
        wrapped_ppo_loss(actor_config, *reversed(ppo_loss_inputs(rows, 2, strict=True)))
    wrapped_ppo_loss(actor_config, *reversed(ppo_loss_inputs(rows, 2)))  # warn: measured, trained on, no refusal


def test_ranks_holding_the_same_micro_batch_count_its_rows_once(actor_config: Any, wrapped_ppo_loss: Any) -> None:
    """Tensor/sequence-parallel ranks run the loss on the same micro-batch: its masked rollouts and its rows
    without an id are counted once, while another micro-batch's count separately (and the driver's add up)."""
    rows = make_rows(random.Random(3), 4)  # row 0 drifts
    rows[2]["id"] = rows[3]["id"] = None  # rows from a loop that gives no id
    for _ in range(2):  # two ranks, the same micro-batch
        wrapped_ppo_loss(actor_config, *reversed(ppo_loss_inputs(rows[:3], 2, strict=True)))
    wrapped_ppo_loss(actor_config, *reversed(ppo_loss_inputs(rows[1:], 2, strict=True)))  # another micro-batch
    numerics_sink.report(unavailable_without_id=2)  # the driver's own (one process): summed
    numerics_sink.report(unavailable_without_id=1)
    got = numerics_sink.drain()
    assert got.masked == {"r0"} and got.unavailable_count == 1 + 2 + 3


def test_rows_that_do_not_fit_their_mask_are_unavailable_with_a_reason_logged_once(caplog: Any) -> None:
    """Logprobs shorter than the row's mask are not cut to fit, a mask value other than 0/1 reaches numcore (which
    refuses it), padding past the mask (0s, or values past its end) changes nothing; one warning per batch."""
    rows = make_rows(random.Random(7), 5)
    td = v1_batch(rows)
    keys = row_keys(td, prompt_lengths(td))
    assert keys is not None
    trainer, engine, mask = rows_of(td["old_log_probs"]), rows_of(td["rollout_log_probs"]), rows_of(td["response_mask"])
    trainer[0] = trainer[0][:-1]  # one logprob short
    mask[1] = [2 if m else 0 for m in mask[1]]  # not a 0/1 mask
    engine[3] = engine[3] + [0.0, 0.0]  # padding past the mask
    mask[4] = mask[4] + [0, 0]
    trainer[4], engine[4] = trainer[4] + [0.0, 0.0], engine[4] + [9.0, 9.0]
    with caplog.at_level("INFO", logger="verl_ext.plugin"):
        out = summarize_rows(keys, trainer, engine, mask, OPTIONS, "old_log_prob", 3)
    assert out.unavailable == ["r0", "r1"]
    assert out.reasons == {"logprobs_shorter_than_mask": 1, "unreadable_row": 1}
    want = expected(rows, "old_log_prob")
    assert {n.rollout_id: n for n in out.measured} == {k: want[k] for k in ("r2", "r3", "r4")}  # r2 untouched
    notes = [r for r in caplog.records if "rows not measured" in r.getMessage()]
    assert len(notes) == 1 and notes[0].levelname == "WARNING" and "r0" in notes[0].getMessage()


def test_numerics_lines_a_failed_write_lost_are_counted(tmp_path: Any, caplog: Any) -> None:
    from verl_ext.plugin import numerics_step, numerics_trainer

    rows = make_rows(random.Random(6), 3)
    (tmp_path / "file").write_text("")  # a records folder under a file: every write fails
    numerics_sink.drain()
    numerics_step._WRITERS.clear()
    try:
        for folder, lost in ((tmp_path / "file" / "records", 3), (tmp_path / "ok", 0)):
            numerics_step._WRITERS.clear()
            numerics_trainer._settings = NumericsSettings(OPTIONS, records_dir=str(folder))
            numerics_sink.report(expected(rows, "old_log_prob").values(), expected=["r0", "r1", "r2"])
            with caplog.at_level("ERROR", logger="verl_ext.plugin"):
                m = numerics_step.step_metrics(3, checked=3.0)
            assert m["tito/numerics/records_not_written"] == lost and m["tito/numerics/rollouts"] == 3
        assert any("cannot write" in r.getMessage() for r in caplog.records)
    finally:
        numerics_trainer._settings = None
        numerics_step._WRITERS.clear()
