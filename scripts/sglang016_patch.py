"""Two source patches to sglang 0.5.16 so its server / bench_one_batch import on the lent H200's image.
Usage: python3 scripts/sglang016_patch.py <dir holding the sglang package>
1. transformers: sglang 0.5.16 pins transformers==5.12.1, the device image has 5.17.0, which already
   registers the model type 'qwen3_asr'; sglang's unguarded AutoConfig.register then raises
   "ValueError: 'qwen3_asr' is already used by a Transformers config" at `import sglang.srt.configs`.
   Patch: exist_ok=True (sglang's class wins, as under 5.12.1). make_carry.sh now also carries transformers
   5.12.1 (which has no qwen3_asr), so the patch only matters if that wheel is dropped; it is harmless otherwise.
2. xgrammar (45 MB wheel) is not carried; sglang/srt/function_call/inkling_detector.py imports it
   unguarded (every other xgrammar import in sglang is in try/except). Patch: same try/except.
"""
import pathlib, sys

root = pathlib.Path(sys.argv[1]) / "sglang"
edits = {
    "srt/configs/qwen3_asr.py": [
        ('AutoConfig.register("qwen3_asr", Qwen3ASRConfig)\n',
         'AutoConfig.register("qwen3_asr", Qwen3ASRConfig, exist_ok=True)\n'),
        ('AutoConfig.register("qwen3_asr_thinker", Qwen3ASRThinkerConfig)\n',
         'AutoConfig.register("qwen3_asr_thinker", Qwen3ASRThinkerConfig, exist_ok=True)\n'),
    ],
    "srt/function_call/inkling_detector.py": [
        ("from xgrammar import StructuralTag\n",
         "try:\n    from xgrammar import StructuralTag\nexcept ImportError:  # xgrammar not carried\n"
         "    from typing import Any as StructuralTag\n"),
    ],
}
for rel, subs in edits.items():
    p = root / rel
    s = p.read_text()
    for old, new in subs:
        assert s.count(old) == 1, (rel, old)
        s = s.replace(old, new)
    p.write_text(s)
    print("patched", rel)
