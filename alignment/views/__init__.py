"""Views that read the measured tables: which learner does a layer resemble more?

The fitted view (`fitted`: Newton and GD matched over their step sizes too; its grid in
`fitted_grid`, torch-free), the spectral view (`spectral`: each layer's filter order) and
the separation views (`separation`: how far apart each view keeps Newton and GD). The
protocol's own view is the learner table of `iclprobe.alignment.comparison`.
"""
