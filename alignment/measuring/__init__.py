"""What `align` measures: every layer's readout, the learners' runs, similarity tables.

Which layer probes a model is read with (`probe_source`), what an alignment holds in
memory (`memory`), every layer's prediction and induced weights and the probes' own noise
(`layers`), the learners' iterates (`runs`), every candidate learner over its fitted
family and its tables (`candidates`, read as probes read a layer: `reading`), layer x step
similarity tables with bootstrap bounds (`similarities`), which layers compute something
(`liveness`), and the best step per layer with its fits (`matching`).
"""
