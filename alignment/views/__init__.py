"""Views that read the measured tables: which learner does a layer resemble more?

The protocol's view (`protocol`: each learner at the protocol's step sizes, its learner
table and verdicts), the fitted view (`fitted`: Newton and GD matched over their step
sizes too; its grid in `iclprobe.alignment.fitted_grid`, torch-free, which the config's
help counts), the spectral view (`spectral`: each layer's filter order) and the
separation views (`separation`: how far apart each view keeps Newton and GD).
"""
