#!/usr/bin/env python3
"""Computes the DH-HMAC-CHAP test vectors of tests.rs independently of the
Rust code, with Python's hashlib, hmac, zlib and pow; run it and compare
with the constants there. The ffdhe2048 prime is rebuilt from its RFC 7919
definition (p = 2^b - 2^(b-64) + {[2^(b-130) e] + X} * 2^64 - 1)."""
import base64, decimal, hashlib, hmac, zlib

def secret(key, hh):
    crc = zlib.crc32(key).to_bytes(4, 'little')
    return 'DHHC-1:%02d:%s:' % (hh, base64.b64encode(key + crc).decode())

H = {1: 'sha256', 2: 'sha384', 3: 'sha512'}
def transform(key, hh, nqn):
    return key if hh == 0 else hmac.new(key, nqn.encode() + b'NVMe-over-Fabrics', H[hh]).digest()

def resp(h, key, chal, seq, tid, label, a, b):
    m = chal + seq.to_bytes(4, 'little') + tid.to_bytes(2, 'little') + b'\0' + label + a.encode() + b'\0' + b.encode()
    return hmac.new(key, m, h).hexdigest()

def aug(h, skey, chal):
    return hmac.new(hashlib.new(h, skey).digest(), chal, h).digest()

HOST = 'nqn.2014-08.org.nvmexpress:uuid:1b4e28ba-2fa1-11d2-883f-0016d3cca427'
SUB = 'nqn.2024-01.io.dpu:vol0'
hkey = bytes(range(32))
ckey = bytes(range(100, 148))
print('host secret', secret(hkey, 1))
print('ctrl secret', secret(ckey, 0))
tk = transform(hkey, 1, HOST)
print('transformed host key', tk.hex())
c1 = bytes(range(0x40, 0x60))
print('R1 sha256 null', resp('sha256', tk, c1, 0x01020304, 0x0a0b, b'HostHost', HOST, SUB))
c2 = bytes(range(0x80, 0xb0))
print('R2 sha384 null', resp('sha384', transform(ckey, 0, SUB), c2, 7, 0x0a0b, b'Controller', SUB, HOST))

decimal.getcontext().prec = 700
e = decimal.Decimal(0); f = decimal.Decimal(1)
for k in range(400):
    if k: f *= k
    e += 1 / f
b = 2048
p = 2**b - 2**(b-64) + (int(decimal.Decimal(2) ** (b - 130) * e) + 560316) * 2**64 - 1
x = int.from_bytes(bytes(range(1, 33)), 'big')
y = int.from_bytes(bytes(range(33, 65)), 'big')
pub = pow(2, x, p).to_bytes(256, 'big')
print('ffdhe2048 public sha256', hashlib.sha256(pub).hexdigest())
skey = pow(pow(2, y, p), x, p).to_bytes(256, 'big')
print('ffdhe2048 shared sha256', hashlib.sha256(skey).hexdigest())
a = aug('sha256', skey, c1)
print('augmented C1', a.hex())
print('R1 sha256 ffdhe2048', resp('sha256', tk, a, 0x01020304, 0x0a0b, b'HostHost', HOST, SUB))
