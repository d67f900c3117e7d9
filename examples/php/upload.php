<?php
// A form upload (multipart) and a raw upload (any other body): answers what arrived.
header('Content-Type: text/plain');
if (!empty($_FILES)) {
    foreach ($_FILES as $name => $f) {
        printf("%s: %s, %d bytes, md5 %s\n", $name, $f['name'], $f['size'], md5_file($f['tmp_name']));
    }
} else {
    $body = file_get_contents('php://input');
    printf("raw body: %d bytes, md5 %s\n", strlen($body), md5($body));
}
