# conftest.py -- lets the pytest-benchmark files import the benchmark scripts beside them.
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
