"""What the SGLang server's image guard costs per request, against what SGLang itself does with the same request.

The guard (verl_ext/engines/sglang_server.py ``prove_image_prompt``) runs SGLang's own rebuild of an image prompt
(its multimodal processor) once more before sending; the baseline is that rebuild as SGLang's tokenizer manager runs
it for the request. The gateway's guard (``SGLangEngine.prove_images``) runs the model's HF processor instead. On CPU,
SGLang 0.5.12 imported with the test shim (tests/engines/sglang_shim.py), the tiny VL fixture's processor; prompts
with two small images (56x56, 56x112) and with one 1280x720 screenshot. Run from the repository root:

    PYTHONPATH=$PWD python bench/sglang_image_guard.py [--runs 15]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests" / "engines"), str(REPO / "bench")]

from _timing import fastest  # noqa: E402


def prompt(processor: Any, images: list[Any]) -> list[int]:
    content = [{"type": "image"} for _ in images] + [{"type": "text", "text": "What is on the screen?"}]
    text = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
    return [int(i) for i in processor(text=[text], images=images, return_tensors="np")["input_ids"][0]]


def time_case(name: str, images: list[Any], processor: Any, mm: Any, tm: Any, gateway: Any, runs: int) -> str:
    """One prompt's line: SGLang's own rebuild, the server's guard and the gateway's, each the fastest of ``runs``."""
    from sglang.srt.managers.io_struct import GenerateReqInput
    from sglang_standin import global_server_args

    from verl_ext.engines.sglang_server import prove_image_prompt

    ids = prompt(processor, images)

    def request() -> Any:
        return GenerateReqInput(rid="b", input_ids=list(ids), image_data=list(images), sampling_params={})

    async def sglang_rebuild() -> None:  # what SGLang's tokenizer manager runs for the request
        obj = request()
        await mm.process_mm_data_async(
            image_data=obj.image_data, input_text=obj.input_ids, request_obj=obj, max_req_input_len=32767
        )

    with global_server_args():
        best = fastest(
            {
                "sglang": lambda: asyncio.run(sglang_rebuild()),
                "guard": lambda: asyncio.run(prove_image_prompt(tm, request(), mm)),
                "gateway_guard": lambda: gateway.prove_images(ids, images),
            },
            runs,
        )
    base = best["sglang"][0]
    return (
        f"{name}, {len(ids)} ids: SGLang's own rebuild {base * 1e3:.1f} ms; the server's guard "
        f"{best['guard'][0] * 1e3:.1f} ms ({best['guard'][0] / base:.2f}x); the gateway's "
        f"{best['gateway_guard'][0] * 1e3:.1f} ms ({best['gateway_guard'][0] / base:.2f}x)"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args(argv)

    from PIL import Image
    from sglang_shim import load_sglang, sglang_installed

    if not sglang_installed():
        print("skipped: sglang 0.5.12 is not installed (make sglang-cpu)")
        return
    from sglang_standin import sglang_mm_processor

    load_sglang(vl=True)
    from verl_ext.demo.run import shipped_tokenizers
    from verl_ext.demo.vl_model import build_vl_processor
    from verl_ext.gateway.sglang_engine import SGLangEngine

    processor = build_vl_processor(shipped_tokenizers()["qwen2.5"])
    mm = sglang_mm_processor(processor, processor.config)
    tm = SimpleNamespace(server_args=SimpleNamespace(skip_tokenizer_init=True), max_req_input_len=32767)
    gateway = SGLangEngine("http://unused:1", processor=processor)
    cases = {
        "2 images (56x56, 56x112)": [Image.new("RGB", (56, 56), (1, 2, 3)), Image.new("RGB", (56, 112), (4, 5, 6))],
        "1 screenshot (1280x720)": [Image.new("RGB", (1280, 720), (7, 8, 9))],
    }
    print(f"load: {os.getloadavg()}")
    for name, images in cases.items():
        print(time_case(name, images, processor, mm, tm, gateway, args.runs))
    print(f"load: {os.getloadavg()}")


if __name__ == "__main__":
    main()
