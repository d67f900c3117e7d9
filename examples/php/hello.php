<?php
// The smallest PHP page: what the benchmarks call "hello world".
echo "Hello, world\n";
