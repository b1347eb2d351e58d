"""A job that prints what a study's job is given: its CUDA_VISIBLE_DEVICES and its arguments
(tests/test_study_devices.py runs it as the study runs fairseq-train, forked from the job server)."""
import json
import os
import sys

print(json.dumps({"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"), "args": sys.argv[1:]}))
