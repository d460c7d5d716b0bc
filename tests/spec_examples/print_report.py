"""The API reference's example of ProfileResult.print_report: the baseline, each task's exposed time, the SUM."""
import re

from sw_pipeline import ProfileResult

result = ProfileResult(baseline_s=0.008503, exposed_s={"CopyBatch": 0.000521, "EmbLookup": 0.001234})

# -- as written --
result.print_report()
# Baseline serial iteration: 8.503 ms
#
#   Task                       Exposed   % baseline
#   ------------------------ ---------- ------------
#   CopyBatch                  0.521ms        6.1%
#   EmbLookup                  1.234ms       14.5%
#   ...
#   ------------------------ ---------- ------------
#   SUM                        7.571ms       89.0%

# -- checked --
ours = result.format_report().splitlines()
sample = reference_output("result.print_report()")
assert ours[0] == sample[0]  # Baseline serial iteration: 8.503 ms
rows = {line.split()[0]: line.split()[1:3] for line in ours if re.match(r"^\s+(CopyBatch|EmbLookup|SUM)\s", line)}
assert rows == {"CopyBatch": ["0.521ms", "6.1%"], "EmbLookup": ["1.234ms", "14.5%"], "SUM": ["1.755ms", "20.6%"]}
