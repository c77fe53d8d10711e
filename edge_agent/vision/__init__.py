"""Camera-frame geometry and what to look at: the pure building blocks of the vision modes.

One module per job, numpy (and cv2 for resizing and the motion image), no I/O but the
region grid's JSON file, whose path the caller passes (`Layout.regions(pipeline)`):

- `geometry`: `Geometry`, how a frame or a rectangle of it becomes the model's input
  (crop, scale, pad; fit "letterbox" | "stretch" | "crop"), and the map back.
- `mapping`: `to_frame`, a head's results (boxes, keypoints, text polygons) mapped back
  through the geometry of the call that made them.
- `zones`: `Zone`, `Mask` (spec models) and `Scene` (bottom-centre membership, masking,
  the motion mask).
- `tiles`: `tile_grid` and `merge_detections` (NMS over the union, cut boxes joined).
- `motion`: `MotionDetector`, moving boxes against a running background.
- `regions`: `RegionPlanner` (which squares to run this frame) and `RegionGrid`
  (learned object sizes per cell).
- `tracker`: `Tracker`, stable ids with new / update / end events.
- `clips`: 720p and 1080p test clips with truth boxes (tests and benchmarks only).

How a pipeline uses them, per frame (heads decode in model-input pixels; the pipeline's
`pipelines.detect.Detector` is this loop):

    for rect in rects:                       # [whole frame] | tile_grid(...) | planner.plan(...)
        g = Geometry.fit(frame_size, model_size, fit, pad_value, crop=rect)
        tensor = g.prepare(frame, buffer)    # buffer = g.new_input(), allocated once
        found = head.decode(outputs, model_size)       # boxes in model-input pixels
        results = to_frame(found, g)                   # boxes and keypoints, frame pixels
    detections = merge_detections(per_rect, frame_size)   # tiles and regions only
    detections = scene.unmasked(detections)
    tracker.update(ts, detections); planner.learn(boxes of confirmed detections)
"""
