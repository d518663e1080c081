"""The loop: one scheduling cycle after another, the state it keeps, the provisioner it drives."""
