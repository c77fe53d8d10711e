"""On-device INT8 calibration with NNCF, gated on accuracy against the FP32 model."""
