"""A recovery point consistent across tables: which replica version of each table shows the
source as it was at one instant.

- :mod:`.recovery_point`: the recovery point, planned purely from each table's timeline;
- :mod:`.recovery_inputs`: what it is computed from, read from the target side.
"""
