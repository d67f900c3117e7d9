<?php
// 40000 bytes of body: more than one 16384-byte RESP_STREAM packet.
for ($i = 0; $i < 1000; $i++) {
    printf("line %05d %s\n", $i, str_repeat('x', 28));
}
