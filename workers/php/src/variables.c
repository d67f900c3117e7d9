/*
 * corral-php-worker's $_SERVER registration: the functions the Rust side (src/php.rs,
 * src/keys.rs) calls while PHP fills $_SERVER through the SAPI module's
 * register_server_variables callback (src/sapi.c), one entry each. Kept apart from the SAPI
 * module: they touch only the array PHP passes and PHP's strings.
 */

#include <main/php.h>
#include <main/php_variables.h>

/* Registers one $_SERVER entry through PHP's full variable registration (a key with `.`,
 * spaces or `[`, which PHP rewrites or parses); `key` is NUL-terminated. Called back from
 * corral_rs_register_variables for the rare key that needs it. */
void corral_php_register_variable(zval *track_vars_array, const char *key, const char *value,
                                  size_t value_len)
{
    php_register_variable_safe(key, value, value_len, track_vars_array);
}

/* Registers one $_SERVER entry whose key needs no parsing (letters, digits and '_', checked
 * by the caller), with both lengths known: no copy of the key, no scan for its end. */
void corral_php_register_known(zval *track_vars_array, const char *key, size_t key_len,
                               const char *value, size_t value_len)
{
    zval v;
    ZVAL_STRINGL_FAST(&v, value, value_len);
    php_register_known_variable(key, key_len, &v, track_vars_array);
}

/* Worker mode's kept $_SERVER keys (src/keys.rs): PHP's string for a plain key, its hash
 * computed, with a reference of its own (none needed for an interned string); NULL for
 * GLOBALS, which PHP never registers. */
zend_string *corral_php_key_new(const char *key, size_t key_len)
{
    if (key_len == sizeof("GLOBALS") - 1 && memcmp(key, "GLOBALS", key_len) == 0) {
        return NULL;
    }
    zend_string *s = zend_string_init_interned(key, key_len, 0);
    zend_string_hash_val(s);
    return s;
}

void corral_php_key_release(zend_string *key)
{
    zend_string_release(key);
}

/* One $_SERVER entry under a kept key, as php_register_known_variable stores it. */
void corral_php_register_key(zval *track_vars_array, zend_string *key, const char *value,
                             size_t value_len)
{
    if (Z_TYPE_P(track_vars_array) != IS_ARRAY) {
        return;
    }
    zval v;
    ZVAL_STRINGL_FAST(&v, value, value_len);
    zend_hash_update_ind(Z_ARRVAL_P(track_vars_array), key, &v);
}
