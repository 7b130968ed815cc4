"""Tables taking turns on a few apply workers instead of each running its own always-on
query. A change-feed table's side of it is :mod:`lakemirror.supervisor.change_feed.turn_taker`.

- :mod:`.worker_pool`: the pool that grants the turns, longest-waiting table first;
- :mod:`.query_gate`: where an always-on query waits for its table's turn: inside its batch function.
"""
