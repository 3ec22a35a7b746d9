"""What acts around each epoch, called by the loop in a fixed order on every rank: the
model parts that change the model (``modelparts``: ``weightema``, ``precisebn``,
``bestcheckpoint``) and the observers that only read the log (``observers``, ``board``)."""
