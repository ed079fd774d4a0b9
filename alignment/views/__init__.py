"""Views that read the measured tables: which learner does a layer run?

The answer (`answer`: every candidate learner, each over its fitted family, and per layer
the one the layer runs, "cannot tell" among several, or "none of them"), the fitted view
(`fitted`: Newton and GD matched over their step sizes too, the Newton-vs-GD verdict),
the protocol's view (`protocol`: each learner at the protocol's step sizes, its learner
table and verdicts), the spectral view (`spectral`: each layer's filter order) and the
separation views (`separation`: how far apart each view keeps Newton and GD).
"""
