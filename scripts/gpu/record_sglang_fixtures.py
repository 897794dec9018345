import json
import os
import time
import traceback

OUT = os.environ.get("OUT", "/tmp/out")


def dump(name, obj):
    with open(os.path.join(OUT, name + ".json"), "w") as f:
        json.dump(obj, f, indent=1, default=str)


def main():
    import importlib

    for m in [
        "sgl_kernel",
        "flashinfer",
        "flashinfer.comm",
        "sglang",
        "sglang.srt.entrypoints.engine",
        "sglang.srt.managers.scheduler",
        "sglang.srt.model_executor.model_runner",
        "sglang.srt.models.qwen3",
        "sglang.srt.layers.attention.triton_backend",
    ]:
        t = time.time()
        importlib.import_module(m)
        print("IMPORT OK", m, round(time.time() - t, 1), flush=True)
    import sglang

    eng = sglang.Engine(
        model_path=os.path.abspath(".gpu/model"),
        skip_tokenizer_init=True,
        load_format="dummy",
        attention_backend="triton",
        sampling_backend="pytorch",
        grammar_backend="none",
        disable_cuda_graph=True,
        disable_piecewise_cuda_graph=True,
        mem_fraction_static=0.3,
        random_seed=0,
        log_level="info",
    )
    print("ENGINE UP", flush=True)
    prompt = [151644, 872, 198, 9707, 151645, 198, 151644, 77091, 198]
    cases = [
        ("normal_stop_forced_eos", dict(max_new_tokens=8, temperature=0.0, logit_bias={"151645": 100.0}), {}),
        (
            "user_stop_id",
            dict(max_new_tokens=8, temperature=0.0, stop_token_ids=[151658], logit_bias={"151658": 100.0}),
            {},
        ),
        ("length", dict(max_new_tokens=5, temperature=0.0, ignore_eos=True), {}),
        ("eos_last_of_length", dict(max_new_tokens=1, temperature=0.0, logit_bias={"151645": 100.0}), {}),
        ("logprobs", dict(max_new_tokens=6, temperature=1.0, ignore_eos=True), dict(return_logprob=True)),
        (
            "logprobs_input",
            dict(max_new_tokens=3, temperature=1.0, ignore_eos=True),
            dict(return_logprob=True, logprob_start_len=0),
        ),
    ]
    for name, sp, kw in cases:
        try:
            req = dict(input_ids=prompt, sampling_params=sp, **kw)
            r = eng.generate(**req)
            dump(name, {"case": name, "request": req, "response": r})
            print("CASE", name, json.dumps(r, default=str)[:400], flush=True)
        except Exception:
            traceback.print_exc()
    eng.shutdown()


if __name__ == "__main__":
    main()
