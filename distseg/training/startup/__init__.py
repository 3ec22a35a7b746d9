"""The decisions a run takes once, before its first step: the inputs and the run
directory (``prepare``), the precision (``precision``, its cache ``precision_cache``),
the gradient compression (``compression``), the lr (``lrfind``), the timed steps the
trials share (``timedsteps``), an elastic incarnation's start (``elastic``)."""
