"""What `align` shows: one screen, full tables, a notebook's rendering, the report folder.

`screen` (what ``iclprobe align`` prints), `tables` (``--verbose`` and the report's tables),
`display` (repr, HTML, DataFrame), `report` and `report_model` (the report folder),
`plots` (its figures) and `drawing` (the figures drawn after the text, one process per
core).
"""
