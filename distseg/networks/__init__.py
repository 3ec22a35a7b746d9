"""The U-Net: one spec read by the builder and the memory planner, the Keras builder,
and the losses and Dice counts (TensorFlow and numpy forms)."""
