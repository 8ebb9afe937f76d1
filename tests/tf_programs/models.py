"""The small Keras model the TensorFlow test programs train.

Example:
    tf.keras.utils.set_random_seed(1)
    model = small_cnn(conv_layers=6)
    model.train_on_batch(images, labels)
"""

from __future__ import annotations

import tensorflow as tf


def small_cnn(conv_layers: int) -> tf.keras.Model:
    """`conv_layers` 3x3 convolutions of 32 channels on 64x64x3 images, pooled into
    10 logits; compiled with SGD(0.01) and sparse cross-entropy. Seed first."""
    inputs = tf.keras.Input((64, 64, 3))
    x = inputs
    for _ in range(conv_layers):
        x = tf.keras.layers.Conv2D(32, 3, padding="same", activation="relu")(x)
    x = tf.keras.layers.GlobalAveragePooling2D()(x)
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(10)(x))
    model.compile(optimizer=tf.keras.optimizers.SGD(0.01),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model
