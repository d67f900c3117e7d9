<?php
// POST with a body, a query, an unknown header and a special-env ini override.
echo "method=", $_SERVER['REQUEST_METHOD'], "\n";
echo "get[mode]=", $_GET['mode'], "\n";
echo "content_type=", $_SERVER['CONTENT_TYPE'], "\n";
echo "content_length=", $_SERVER['CONTENT_LENGTH'], "\n";
echo "x_custom_thing=", $_SERVER['HTTP_X_CUSTOM_THING'], "\n";
echo "display_errors=", ini_get('display_errors'), "\n";
echo "input=", file_get_contents('php://input'), "\n";
ksort($_POST);
foreach ($_POST as $k => $v) {
    echo "post[$k]=$v\n";
}
foreach (getallheaders() as $k => $v) {
    echo "header[$k]=$v\n";
}
