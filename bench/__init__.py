"""lakemirror's benchmark suite (`make bench`): lakemirror against its baselines, side by side."""
