#!/bin/sh
# Test certificates for the TLS tests: usage make_test_certs.sh OPENSSL DIR.
# Two CAs; the server cert (localhost, 127.0.0.1) and client cert "good" from CA 1, client
# "rogue" from CA 2. Valid two days; EC P-256 keys.
set -e
O=$1
cd "$2"
key() { "$O" genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1.key"; }
for ca in ca1 ca2; do
  key $ca
  "$O" req -x509 -new -key $ca.key -out $ca.pem -days 2 -subj "/CN=$ca-test-root"
done
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' > server.ext
printf 'extendedKeyUsage=clientAuth\n' > client.ext
sign() {
  key $1
  "$O" req -new -key $1.key -out $1.csr -subj "/CN=$1"
  "$O" x509 -req -in $1.csr -CA $2.pem -CAkey $2.key -CAcreateserial -out $1.pem -days 2 -extfile $3
}
sign server ca1 server.ext
sign good ca1 client.ext
sign rogue ca2 client.ext
