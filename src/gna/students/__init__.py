"""SSM and hybrid students: the mixer, student folders and names, distillation, decoding and memory, scoring."""
