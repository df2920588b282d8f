"""Reference implementations copied from the authors' repositories, used only as test oracles."""
