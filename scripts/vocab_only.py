#!/usr/bin/env python3
"""Writes a vocabulary-only GGUF (the tokenizer.* keys of a model, no tensors), small enough to
carry to the GPU machine, where `rocmforge synth --vocab` builds a model of a real shape with the
real vocabulary (the output head's size follows it).

    python3 scripts/vocab_only.py MODEL.gguf OUT.gguf      (needs `pip install gguf`)
"""
import sys

import gguf


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, out = sys.argv[1], sys.argv[2]
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(out, arch)
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(name, field.contents(), kind, sub_type=field.types[-1])
        else:
            writer.add_key_value(name, field.contents(), kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()


if __name__ == "__main__":
    main()
